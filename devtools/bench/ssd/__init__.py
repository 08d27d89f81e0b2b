"""The SSD tier's benchmark modes, driven by ``scripts/bench_tiers.py`` (each mode's work runs in a
fresh child process of that script, so a cold read starts with a cold page cache).

- ``modes``       the modes' options, child processes, order and tables, for the script.
- ``user_view``   the tier as a user meets it: put, cold and warm get against SGLang's
                  ``HiCacheFile`` and raw ``O_DIRECT`` I/O; the restart (attach) time.
- ``disk_speed``  one batch of a fresh tier (put, then a cold get in a new process) against ``dd``
                  with direct I/O on the same file system, in the same run.
- ``write_path``  where a put's time goes (profile) and a sustained backlog against the raw disk.
- ``read_path``   where a get's time goes (profile).
- ``throttled``   the user view on a loop device throttled by cgroup blkio limits.
"""
