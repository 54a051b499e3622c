"""The preflight: what every run of a scale will cost on the machine at hand, and what would stop it, before it starts
(``vcarepro preflight``; :mod:`.cli`'s docstring is its help; docs/layout.md lists its modules)."""
