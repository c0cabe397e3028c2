"""once: run a scheduled command exactly once per period, however many machines fire it."""

__version__ = "0.1.0"
