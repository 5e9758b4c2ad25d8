"""The filesystem seam and the filesystems that hold a log in place.

Open filesystem.py first (LogFileSystem: what the engine needs from storage, declared by capability),
then local.py (POSIX local disk, with mounts.py refusing mounts whose locks do not reach every machine)
and memory.py (fsspec's memory store, for tests). storage_options.py turns Spark options and CLI flags
into fsspec storage options and keeps secrets out of messages. Object stores are in storage/objects/;
storage/log_dirs.py picks the filesystem for a log dir URL.
"""
