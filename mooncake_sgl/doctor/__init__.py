"""``mooncake-sgl doctor``: why a storage hit did not happen, or will not, said in sentences.

The questions operators file most against HiCache L3 backends are of one kind: "L3 is written but
never read", "the prefill's pages are not shared with the decode". Each answer sits in a metric, a
server argument or a log line only an expert reads. The doctor reads them for the operator.

- ``evidence``: what is read from a server (its arguments, two looks at its ``/metrics``), bounded
  in time and size; an unreadable server is evidence, not an exception.
- ``findings``: the rules. Pure functions from evidence to ``Finding`` (what, evidence, fix); no I/O,
  so each rule is tested on evidence built by hand, and on live servers set up to trigger it.
- ``cli``: the command: gathers, reads a pool's namespace board, prints text or ``--json``.
"""

from .evidence import ServerEvidence, gather
from .findings import Finding, diagnose

__all__ = ["Finding", "ServerEvidence", "diagnose", "gather"]
