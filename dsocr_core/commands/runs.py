"""`runs`: the runs in a store (id, kind, name, created, points done/oom/error), one run's details, its export."""
from __future__ import annotations

import json
from pathlib import Path

from ..cli import UserError


def register(sub) -> None:
    p = sub.add_parser("runs", help="list the runs in the run store, or show / export one (a unique id prefix will do)")
    p.add_argument("run", nargs="?", help="a run id or a unique prefix of one: show that run")
    p.add_argument("--store", type=Path, default=None, help="run store (default data/runs.sqlite or $DSOCR_STORE)")
    p.add_argument("--kind", choices=["sweep", "dataset", "parity", "reference"], help="only runs of this kind")
    p.add_argument("--export", type=Path, metavar="PATH", help="write the run to this .json or .csv")
    p.add_argument("--save-routing", type=Path, metavar="FILE",
                   help="write the MoE routing the run observed as a routing profile (analytic --routing FILE)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..results.runs import run_details, runs_table
    from ..results.store import RunStore, StoreError, default_path

    path = args.store if args.store is not None else default_path()
    if not Path(path).is_file():
        raise UserError(f"no run store at {path} (measure, profile or the dashboard create one)")
    for flag, value in (("--export", args.export), ("--save-routing", args.save_routing)):
        if value and not args.run:
            raise UserError(f"{flag} needs a run: python -m dsocr_core runs RUN_ID {flag} PATH")
    try:
        store = RunStore(path)
        if args.run:
            run_id = store.resolve_id(args.run, kinds=(args.kind,) if args.kind else None)
            info = store.get_run(run_id)
            if args.export:
                print(f"exported run {run_id} to {store.export_run(run_id, args.export)}")
            if args.save_routing:
                _save_routing(store, run_id, info, args.save_routing)
            if args.export or args.save_routing:
                return 0
            if args.json:
                print(json.dumps(info, default=str))
            else:
                print(run_details(info))
            return 0
        runs = store.list_runs(kind=args.kind)
    except StoreError as exc:  # corrupt store, unknown or ambiguous id: one line, exit 2
        raise UserError(str(exc)) from None
    if args.json:
        keys = ("id", "kind", "name", "created_at", "n_points", "n_done", "n_oom", "n_error")
        print(json.dumps([{k: r.get(k) for k in keys} for r in runs]))
    elif not runs:
        print(f"no {args.kind + ' ' if args.kind else ''}runs in {store.path}")
    else:
        print(runs_table(runs))
        print(f"\n{len(runs)} run(s) in {store.path}; any unique prefix of an id will do")
    return 0


def _save_routing(store, run_id: str, info: dict, path: Path) -> None:
    """The run's observed routing (results.analytic_join.observed_routing) as a routing profile file."""
    from ..results.analytic_join import observed_routing

    routing = observed_routing(info, store.points(run_id))
    if routing is None:
        raise UserError(f"run {run_id[:12]} recorded no MoE routing (measured before routing was recorded, or a "
                        "model without MoE layers); nothing saved")
    out = routing.save(path)
    print(f"saved the routing run {run_id[:12]} observed ({sum(routing.samples)} layer-calls, "
          f"{len(routing.tokens)} token counts) to {out}")
