"""One module per parallelism technique (fp8, tp, checkpointing, compile, fsdp, ddp); ``parallel/assembly/compose.py``
applies them in one order. Each takes meshes and typed settings, never the config, and imports none of the others
but ``checkpointing.blocks_of``."""
