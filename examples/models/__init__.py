"""Example model factories for `python://models.<module>:<factory>` sources.

The manifests in examples/ name these; `kompile run` puts the manifest's folder on sys.path, so a
user's own factories can live next to their manifest the same way. Weights are random and seeded:
nothing is downloaded at run time.
"""
