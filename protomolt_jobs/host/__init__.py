"""The reference ProtoMolt node: composer, catalog, channels, node configuration, surfaces,
the registry and parse roles, and the CLI.

Imports go one way: ``host`` may import the role; the role never imports ``host``.
"""
