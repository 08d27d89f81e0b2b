"""The SGLang HiCache adapter: the only package of mooncake_sgl that imports sglang.

- ``plugin``         the ``sglang.srt.plugins`` entry point registering the backend name ``mooncake``.
- ``backend``        ``MooncakeSglStorage``, the ``HiCacheStorage`` over our ``TieredStore``.
- ``page_objects``   a host pool as stored objects, and ``move_pages``: the one path every API's pages take.
- ``sglang_config``, ``sglang_pool``  what we use of SGLang's storage config and of each host pool,
                     read once at attach into frozen records.
- ``boundary``       every failure of a storage call becomes a miss of the method's own shape.
- ``layout``         host pool and storage config → page views, key namespace, per-rank file names
                     and which rank reports a shared directory.
- ``sidecars``       hybrid models (SGLang's v2 API): sidecar pools and which prefixes restore.
- ``fingerprint``    a cheap fingerprint of the checkpoint, so new weights never read old pages.
- ``weight_updates`` the namespace follows SGLang's run-time weight updates.
- ``namespace_board`` who else keys pages into the shared tiers, and whether their pages meet ours.
- ``staging_room``   whether SGLang's host pool leaves storage hits room to be staged.
- ``l3_layout``, ``call_metrics``, ``page_hash``  SGLang's layout query, ``get_stats``, and the page
                     hash loaded at attach.
- ``touch_points``   every change made to SGLang, declared once and applied from that list.

The adaptations for serving on a host without CUDA are a distribution of their own (``cpu_host/``).

Nothing is imported here, so loading the entry point costs no more than ``plugin`` itself.
"""
