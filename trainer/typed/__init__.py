"""The composed config typed: where it stops on its way into parallel/ and models/."""
