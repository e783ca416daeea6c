"""The foundation of parallel/: what techniques/ and pipeline/ stand on (the mesh dimensions, the typed run, timers,
memory, precision, the timed all-to-all ...). Imports nothing else of parallel/."""
