"""Image preprocessing presets (``*.toml``), installed as ``quantbench.configs`` so that
``--preset NAME`` finds them from a wheel as well as from a source checkout."""
