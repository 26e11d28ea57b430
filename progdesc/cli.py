"""The `progdesc` command: demo (and later show, run, export)."""
import argparse
import sys


def _parser():
    parser = argparse.ArgumentParser(prog="progdesc", description=(
        "Program descriptions compiled to XLA through JAX."))
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a small CNN on the bundled 8x8 digits",
                          description="Train a small CNN on scikit-learn's 8x8 digits and "
                                      "report the held-out accuracy.")
    demo.add_argument("--epochs", type=int, default=12, help="passes over the training set")
    return parser


def main(argv=None):
    """Entry point; returns the exit code."""
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from progdesc import demo
        return demo.run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
