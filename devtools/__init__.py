"""Tools for working on kompile from its repository: a local Kubernetes control plane
(``python -m devtools.devcluster``) and the server-process handling it shares with the tests.

Not part of the installed ``kompile`` package: these reach ``scripts/`` and may install ``openssl``
with ``apt-get``, which only make sense in a checkout.
"""
