"""python3 -m scripts.tool INPUT.csv [OUTPUT.json]: the summary as JSON."""
import json
import sys

from .summary import summarise


def main():
    src = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else "/workspace/summary.json"
    with open(out, "w") as f:
        json.dump(summarise(src), f, indent=2, sort_keys=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
