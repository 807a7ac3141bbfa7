"""`mlx-grpo report RUN_DIR [...]`: the reward report of a run, printed and written into the run directory;
`--html` draws the run (several runs overlaid) into one self-contained HTML file, `--svg DIR` each chart
into a file of its own."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", help="run directories (each holds metrics.jsonl)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of tables")
    parser.add_argument("--no-write", dest="write", action="store_false",
                        help="do not write report.json and report.md into the run directory")
    parser.add_argument("--html", nargs="?", const="", metavar="FILE",
                        help="also write one self-contained HTML file of charts, samples and the report, runs "
                             "overlaid (default: report.html in the first run directory; needs the report extra: "
                             "pip install -e '.[report]')")
    parser.add_argument("--svg", metavar="DIR",
                        help="also write each chart, runs overlaid, as its own SVG file in DIR "
                             "(e.g. DIR/held-out-accuracy.svg; needs the report extra)")
    parser.add_argument("--smooth", type=float, default=0.0, metavar="WEIGHT",
                        help="with --html/--svg: draw each line smoothed like TensorBoard's slider (an exponential "
                             "moving average, e.g. 0.6; the raw points stay faint beneath); 0 = off (default)")


def run(args: argparse.Namespace) -> int:
    from ..common.errors import UserError
    from ..telemetry.analysis.report import build_report, print_report, report_json, save_report

    if not 0 <= args.smooth < 1:
        raise UserError(f"--smooth {args.smooth:g}: expected a weight in [0, 1), e.g. 0.6")
    if args.html is not None or args.svg is not None:
        from ..telemetry.analysis.html_report import require_matplotlib

        require_matplotlib()  # before the text report is printed or report.json written
    for run_dir in args.run_dirs:
        title, report = build_report(run_dir)
        written = args.write
        if args.write:
            try:
                save_report(run_dir, title, report)
            except OSError as err:  # a read-only or full run directory: the report is still printed
                written = False
                print(f"mlx-grpo report: warning: could not write report.json in {run_dir} "
                      f"({err.strerror or err}); --no-write skips it", file=sys.stderr)
        if args.json:
            print(report_json(title, report), end="")
        else:
            print_report(report, title)
            if written:
                print(f"wrote {run_dir.rstrip('/')}/report.json and report.md")
    try:
        if args.html is not None:
            from ..telemetry.analysis.html_report import write_html_report

            path = write_html_report(args.run_dirs, args.html or None, args.smooth)
            if not args.json:
                print(f"wrote {path}")
        if args.svg is not None:
            from ..telemetry.analysis.html_report import write_chart_files

            paths = write_chart_files(args.run_dirs, args.svg, args.smooth)
            if not args.json:
                print(f"wrote {len(paths)} charts to {args.svg}: {', '.join(p.name for p in paths)}")
    except OSError as err:
        raise UserError(f"cannot write {err.filename or 'the report file'} ({err.strerror or err})") from None
    return 0
