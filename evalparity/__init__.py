"""evalparity: does backend or dtype drift change model quality?

Pipeline (one module or package per stage, each reading the files the stage before wrote):
spec (``spec``) -> cells (``cells``, ``matrix``) -> per-sample table (``samples``) -> statistics
(``stats``) -> report (``report``).
"""

__version__ = "0.1.0"
