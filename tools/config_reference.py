"""Writes docs/config.md from the config's section dataclasses (megatron/config/reference.py).
Run it after changing a field: tests/unit/test_config_reference.py fails while the file differs.

    python tools/config_reference.py            # writes docs/config.md
    python tools/config_reference.py --check    # exit 1 when docs/config.md is stale"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron.config import reference  # noqa: E402

PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                    "config.md")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only compare; exit 1 when stale")
    args = p.parse_args()
    text = reference.markdown()
    if args.check:
        with open(PATH) as f:
            stale = f.read() != text
        print(f"{PATH} is {'stale: run tools/config_reference.py' if stale else 'current'}")
        return int(stale)
    with open(PATH, "w") as f:
        f.write(text)
    print(f"wrote {PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
