"""Running nodes: the composition root (``node``), the command line, the
``--workers`` supervisor and the figures. The one layer that may import
every other, and the only one that knows the real reactor.
"""
