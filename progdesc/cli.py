"""The `progdesc` command: demo, show, run, export and launch.

    progdesc demo [--epochs N] [--save-dir DIR]
    progdesc show FILE_OR_MODEL_DIR
    progdesc run MODEL --feed NAME=PATH.npy ... [--fetch NAME ...] [--out DIR]
    progdesc export MODEL_DIR -o FILE [--platforms cpu,cuda,tpu] [--params-as-inputs]
    progdesc launch --nprocs N [--max-restarts R] SCRIPT [ARGS...]

MODEL_DIR is an inference model directory of ours, a PaddlePaddle model (its
directory, the path prefix of its .pdmodel or .json, or that file), or an ONNX model
(a .onnx file, its external data beside it). An ONNX model is exported with its
symbolic dims (dim_param) as symbolic dims of the same names. `run` also takes a
compiled artifact (`.pdx`, what `export` writes).

Bad arguments and unreadable or invalid files end with exit code 2 and one
line on stderr, which names the command and the argument at fault (the model, a
`--feed` or a `--fetch`), never the script that launched the command.
"""
import argparse
import io as _io
import os
import re
import sys

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: 'progdesc ...: error: ...'."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


class UsageError(Exception):
    """A bad argument found after parsing (exit code 2)."""


def _parser():
    parser = _Parser(prog="progdesc", description=(
        "Program descriptions compiled to XLA through JAX."))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", help="train a small CNN on the bundled 8x8 digits",
                          description="Train a small CNN on scikit-learn's 8x8 digits and "
                                      "report the held-out accuracy.")
    demo.add_argument("--epochs", type=int, default=12, help="passes over the training set")
    demo.add_argument("--save-dir", metavar="DIR",
                      help="save the trained model there as an inference model directory")
    show = sub.add_parser("show", help="print a program, checkpoint, model dir or artifact",
                          description="Print a program file (binary or text), a checkpoint's "
                                      "variables, an inference model directory, a PaddlePaddle or "
                                      "ONNX model (translated), or a compiled artifact's header.")
    show.add_argument("path", metavar="FILE",
                      help="file, inference model directory, Paddle model or .onnx file")
    run = sub.add_parser("run", help="run an inference model or a .pdx on .npy inputs",
                         description="Run an inference model (a directory, a Paddle or ONNX "
                                     "model) or a compiled .pdx artifact on NumPy .npy feeds; "
                                     "print the results or save them as .npy files.")
    run.add_argument("model_dir", metavar="MODEL")
    run.add_argument("--feed", action="append", default=[], metavar="NAME=PATH.npy",
                     help="a feed and the .npy file holding its value (repeat for each feed)")
    run.add_argument("--fetch", action="append", metavar="NAME",
                     help="variable to fetch (repeatable; default: the model's fetch targets)")
    run.add_argument("--out", metavar="DIR", help="write each result to DIR/NAME.npy")
    export = sub.add_parser("export", help="compile an inference model to one StableHLO file",
                            description="Lower an inference model directory through jax.export "
                                        "to one file that runs with JAX alone, any batch size.")
    export.add_argument("model_dir", metavar="MODEL_DIR")
    export.add_argument("-o", "--output", required=True, metavar="FILE", help="artifact to write")
    export.add_argument("--platforms", default="cpu,cuda,tpu",
                        help=f"comma-separated, from {', '.join(PLATFORMS)} (default: %(default)s)")
    export.add_argument("--params-as-inputs", action="store_true",
                        help="take parameters as inputs after the feeds instead of embedding them")
    export.add_argument("--keep-64bit", action="store_true",
                        help="keep int64/float64 feeds and fetches 64-bit (callers need x64)")
    _launch_parser(sub)
    return parser


def _count(minimum):
    """An argparse type: an int >= `minimum`."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an int >= {minimum}, got '{text}'")
        return value
    return parse


def _launch_parser(sub):
    launch = sub.add_parser(
        "launch", help="run a training script in N processes, restarting them on a failure",
        description="Start NPROCS processes of SCRIPT on this host, each with the coordinator, "
                    "its rank and the process count in its environment (what "
                    "progdesc.distributed.initialize() reads). Their output is prefixed by "
                    "[rank]; SIGINT, SIGTERM and SIGHUP go to all. When one fails, the others "
                    "are stopped (SIGTERM, SIGKILL 2 s later) and all start again, at most "
                    "--max-restarts times: the script "
                    "resumes from its last checkpoint (PROGDESC_RESTART_COUNT says how many "
                    "restarts came before). Exits 0 when the job finishes, else with the "
                    "failed process's status.")
    launch.add_argument("--nprocs", type=_count(1), required=True, metavar="N",
                        help="processes to start")
    launch.add_argument("--max-restarts", type=_count(0), default=0, metavar="R",
                        help="restart all at most R times after a failure (default: 0)")
    launch.add_argument("--stop-timeout", type=_count(0), default=10, metavar="SECONDS",
                        help="after a signal to the launcher, wait this long for the "
                             "processes before SIGKILL (default: 10); after a failure the "
                             "others get 2 s, or this if shorter")
    launch.add_argument("-m", "--module", action="store_true",
                        help="SCRIPT is a module name, run as 'python -m SCRIPT'")
    launch.add_argument("script", metavar="SCRIPT", help="the training script (Python)")
    launch.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments of the script")


def main(argv=None):
    """Entry point; returns the exit code."""
    args = _parser().parse_args(argv)
    from lowering.errors import ProgdescError
    from progdesc.callsites import command_frame
    try:
        with command_frame(sys._getframe()):
            return _COMMANDS[args.command](args)
    except (ProgdescError, UsageError, OSError) as e:
        message = " ".join(str(e).split())
        concerns = _argument_of(args, e)
        if concerns:
            message += f" ({concerns})"
        print(f"progdesc {args.command}: error: {message}", file=sys.stderr)
        return 2


def _argument_of(args, error):
    """The command-line argument `error` is about, when its message does not name it: the
    --feed or --fetch of its variable, else the model; '' for none."""
    message = str(error)
    var = getattr(error, "var", None)
    if var is not None:
        for spec in getattr(args, "feed", None) or ():
            if spec.partition("=")[0] == var:
                return f"--feed {spec}"
        if var in (getattr(args, "fetch", None) or ()):
            return f"--fetch {var}"
    model = getattr(args, "model_dir", None) or getattr(args, "path", None)
    named = [getattr(args, a, None) for a in ("model_dir", "path", "output", "out")]
    if model is None or isinstance(error, UsageError) or any(
            n and str(n) in message for n in named):
        return ""
    return f"model {model}"


def _demo(args):
    from progdesc import demo
    return demo.run(args)


def _load_model(path, exe, scope):
    """(program, feed names, fetch targets) of an inference model of ours, of Paddle's or
    of ONNX's."""
    from progdesc import io, paddle
    if _is_onnx(path):
        from progdesc import onnx
        return onnx.load(path, scope)
    if paddle.is_paddle_model(path):
        return paddle.load_inference_model(path, exe, scope)
    return io.load_inference_model(path, exe, scope)


def _show(args):
    from progdesc import export, io, paddle
    path = args.path
    if _is_onnx(path):
        return _show_onnx(path)
    if paddle.is_paddle_model(path):
        return _show_paddle(path)
    if os.path.isdir(path):
        manifest, program, values = io.read_inference_model(path)
        print(f"inference model {path} (format {manifest['format_version']})")
        for key in ("feed", "fetch"):
            for name in manifest[key]:
                var = program.global_block().var(name)
                print(f"  {key:5} {name}: {var.dtype}{list(var.shape)}")
        _print_values(values, "parameters")
        print(program)
        return 0
    data = io.read_file(path)
    if data[:8] == export.MAGIC:
        header, payload = export.read_compiled(data, path)
        print(f"compiled artifact {path} (format {header['format_version']}, "
              f"{len(payload)} bytes of StableHLO, jax {header.get('jax_version')})")
        print(f"  platforms: {', '.join(header['platforms'])}; 64-bit boundary: {header['x64']}; "
              f"precision: {header.get('precision', 'default')}")
        for key, label in (("feeds", "feed"), ("params", "param"), ("fetches", "fetch")):
            for s in header[key]:
                print(f"  {label:5} {s['name']}: {s['dtype']}[{', '.join(map(str, s['shape']))}]")
        return 0
    if _looks_like_safetensors(data):
        _print_values(io.checkpoint_from_bytes(data, path), f"checkpoint {path}:")
        return 0
    print(io.program_from_bytes(data, path, True if path.endswith(io.TEXT_SUFFIXES) else None))
    return 0


def _show_paddle(path):
    import progdesc as pd
    from progdesc import paddle
    scope = pd.Scope()
    program, feed_names, fetch_targets = paddle.load_inference_model(path, None, scope)
    print(f"PaddlePaddle model {path}, translated")
    block = program.global_block()
    for key, names in (("feed", feed_names), ("fetch", [v.name for v in fetch_targets])):
        for name in names:
            var = block.var(name)
            print(f"  {key:5} {name}: {var.dtype}{list(var.shape)}")
    _print_values({name: scope.get(name) for name in scope.local_var_names()}, "parameters")
    print(program)
    return 0


def _is_onnx(path):
    """Whether `path` is a .onnx file (the onnx package is imported only then)."""
    if not (str(path).endswith(".onnx") and os.path.isfile(path)):
        return False
    try:
        from progdesc import onnx
    except ImportError as e:
        raise UsageError(f"reading ONNX models needs the onnx package "
                         f"(pip install progdesc[onnx]): {e}") from None
    return onnx.is_onnx_model(path)


def _show_onnx(path):
    import progdesc as pd
    from progdesc import onnx
    scope = pd.Scope()
    program, feed_names, fetch_targets = onnx.load(path, scope)
    dims = onnx.input_dims(path)
    print(f"ONNX model {path}, translated")
    block = program.global_block()
    for key, names in (("feed", feed_names), ("fetch", [v.name for v in fetch_targets])):
        for name in names:
            var = block.var(name)
            named = f" ({', '.join(map(str, dims[name]))})" if name in dims else ""
            print(f"  {key:5} {name}: {var.dtype}{list(var.shape)}{named}")
    _print_values({name: scope.get(name) for name in scope.local_var_names()}, "parameters")
    print(program)
    return 0


def _looks_like_safetensors(data):
    n = int.from_bytes(data[:8], "little") if len(data) >= 8 else 0
    return 2 <= n <= len(data) - 8 and data[8:9] == b"{"


def _print_values(values, title):
    total = sum(v.nbytes for v in values.values())
    print(f"{title} {len(values)} variable(s), {total} bytes")
    for name, value in sorted(values.items()):
        print(f"  {name}: {value.dtype}{list(value.shape)}")


def _load_npy(spec):
    import numpy as np
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise UsageError(f"--feed takes NAME=PATH.npy, got '{spec}'")
    try:
        value = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise UsageError(f"cannot read feed '{name}' from '{path}': {e}") from None
    if not isinstance(value, np.ndarray):
        raise UsageError(f"'{path}' is not a .npy file (an .npz archive?)")
    return name, value


def _safe_filename(name, taken):
    base = re.sub(r"[^A-Za-z0-9_.@-]", "_", name).lstrip(".") or "_"
    stem, n = base, 1
    while stem in taken:
        stem, n = f"{base}_{n}", n + 1
    taken.add(stem)
    return stem + ".npy"


def _is_compiled(path):
    """Whether `path` is a file that begins as a compiled artifact does (`export.MAGIC`)."""
    from progdesc import export
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(len(export.MAGIC)) == export.MAGIC


def _check_feeds(feeds, feed_names):
    """UsageError unless `feeds` (name -> value) gives exactly the model's feeds."""
    unknown = sorted(set(feeds) - set(feed_names))
    missing = [n for n in feed_names if n not in feeds]
    if unknown or missing:
        raise UsageError(f"the model's feeds are {feed_names}; "
                         + (f"unknown: {unknown}" if unknown else f"missing: {missing}"))


def _run_compiled(path, feeds, fetch):
    """(fetch names, results) of the compiled artifact at `path` on `feeds`."""
    from progdesc import export
    model = export.load_compiled(path)
    if model.header["params"]:
        raise UsageError(f"'{path}' takes its parameters as inputs (exported with "
                         "--params-as-inputs): run the model it was exported from instead")
    _check_feeds(feeds, model.feed_names)
    unknown = [n for n in fetch or () if n not in model.fetch_names]
    if unknown:
        raise UsageError(f"a compiled artifact returns only {model.fetch_names}; "
                         f"cannot --fetch {unknown}")
    results = dict(zip(model.fetch_names, model(**feeds)))
    names = fetch or model.fetch_names
    return names, [results[n] for n in names]


def _run(args):
    import numpy as np

    import progdesc as pd
    from progdesc import io
    feeds = dict(_load_npy(spec) for spec in args.feed)
    if _is_compiled(args.model_dir):
        fetch, results = _run_compiled(args.model_dir, feeds, args.fetch)
    else:
        exe, scope = pd.Executor(), pd.Scope()
        program, feed_names, fetch_targets = _load_model(args.model_dir, exe, scope)
        _check_feeds(feeds, feed_names)
        fetch = args.fetch or [v.name for v in fetch_targets]
        results = exe.run(program, feed=feeds, fetch_list=fetch, scope=scope)
    taken = set()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    for name, value in zip(fetch, results):
        if args.out:
            buffer = _io.BytesIO()
            np.save(buffer, value, allow_pickle=False)
            path = os.path.join(args.out, _safe_filename(name, taken))
            io.atomic_write(path, buffer.getvalue())
            print(f"{name}: {value.dtype}{list(value.shape)} -> {path}")
        else:
            print(f"{name}: {value.dtype}{list(value.shape)}")
            print(np.array2string(value, threshold=200))
    return 0


def _export(args):
    import progdesc as pd
    from progdesc import export
    platforms = tuple(p.strip().lower() for p in args.platforms.split(",") if p.strip())
    bad = [p for p in platforms if p not in PLATFORMS]
    if bad or not platforms:
        raise UsageError(f"unknown platform(s) {bad or [args.platforms]}; "
                         f"choose from {', '.join(PLATFORMS)}")
    if _is_compiled(args.model_dir):
        raise UsageError(f"'{args.model_dir}' is a compiled artifact already: export takes the "
                         "model it came from (run it with 'progdesc run')")
    scope = pd.Scope()
    program, feed_names, fetch_targets = _load_model(args.model_dir, None, scope)
    polymorphic = True
    if _is_onnx(args.model_dir):   # the model's own dim names, shared where it shares them
        from progdesc import onnx
        polymorphic = {name: tuple(None if isinstance(d, int) else d for d in dims)
                       for name, dims in onnx.input_dims(args.model_dir).items()
                       if name in feed_names}
    header = export.export_compiled(args.output, program, feed_names, fetch_targets, scope,
                                    platforms=platforms, embed_params=not args.params_as_inputs,
                                    batch_polymorphic=polymorphic, keep_64bit=args.keep_64bit)
    shown = "; ".join(f"{s['name']}: {s['dtype']}[{', '.join(map(str, s['shape']))}]"
                      for s in header["feeds"] + header["fetches"])
    print(f"wrote {args.output} for {', '.join(header['platforms'])} ({shown})")
    return 0


def _launch(args):
    from progdesc.distributed import launch
    if args.module:
        command = [sys.executable, "-m", args.script]
    elif os.path.isfile(args.script):
        command = [sys.executable, args.script]
    else:
        raise UsageError(f"no script '{args.script}' (SCRIPT)")
    return launch.launch(command + args.script_args, args.nprocs, args.max_restarts,
                         args.stop_timeout)


_COMMANDS = {"demo": _demo, "show": _show, "run": _run, "export": _export, "launch": _launch}

if __name__ == "__main__":
    sys.exit(main())
