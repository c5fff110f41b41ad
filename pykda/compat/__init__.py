"""Serving engines' own KDA call signatures over pykda's ops, so that an engine's call site
switches by its import alone: `pykda.compat.sglang`."""
