"""What the package plugs into: NxDI's GPT-OSS application class (the hook, its pre-sharded
weights, NxDI's configuration read one way) and the clients that start it (the vLLM entry point).

Importing this package imports nothing; each module is imported where it is used."""

__all__: list[str] = []
