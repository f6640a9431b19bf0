"""The repository's paths, defined once: ROOT (a str; os.path.join, cwd= and environment
variables take it as is, pathlib users wrap it in Path) and the tiny example config."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "examples", "local", "tiny.yaml")
