"""The SSD tier's benchmark modes, driven by ``scripts/bench_tiers.py`` (each mode's work runs in a
fresh child process of that script, so a cold read starts with a cold page cache).

- ``user_view``   the tier as a user meets it: put, cold and warm get against SGLang's
                  ``HiCacheFile`` and raw ``O_DIRECT`` I/O; the restart (attach) time.
- ``write_path``  where a put's time goes (profile) and a sustained backlog against the raw disk.
- ``read_path``   where a get's time goes (profile).
"""
