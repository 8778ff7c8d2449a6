"""``hwb store``: what the artifact store holds; ``hwb store prune``: keep it within a size or
an age, least recently used removed first (:mod:`hwbackends.store.prune`)."""
from __future__ import annotations

import argparse
import time

from ..units import fmt_age, fmt_bytes, parse_age, parse_size
from . import CACHE_DIR_HELP, count, emit, number


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("store", help="what the artifact store holds (size, last use); prune it",
                       description="Lists the store's artifacts and build products, most recently "
                                   "used first. `hwb store prune` removes the least recently used.")
    p.add_argument("--cache-dir", default=None, help=CACHE_DIR_HELP)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--limit", type=count("row count", 0, 1 << 30), default=20,
                   help="rows to list (0: all; the totals always count every entry)")
    p.set_defaults(func=run_list)
    acts = p.add_subparsers(dest="store_action", metavar="ACTION")
    q = acts.add_parser("prune", help="remove the least recently used entries",
                        description="Removes whole artifacts and build products, least recently "
                                    "used first, until the limits hold; one used in the last "
                                    "minute is kept. The zoo's trained models and measured "
                                    "profiles are kept. A removed artifact is rebuilt when next "
                                    "compiled. HWB_CACHE_MAX_SIZE=SIZE does this after every "
                                    "compile by itself.")
    q.add_argument("--max-size", metavar="SIZE", type=number(parse_size, "size"),
                   help="keep artifacts + build products within SIZE (0, 800M, 2G, …; default: no size limit)")
    q.add_argument("--older-than", metavar="AGE", type=number(parse_age, "age"),
                   help="remove what was not used for AGE (12h, 30d, 2w, …; default: no age limit)")
    q.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")
    q.add_argument("--cache-dir", default=argparse.SUPPRESS, help=CACHE_DIR_HELP)
    q.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="machine-readable output")
    q.set_defaults(func=run_prune, prune_parser=q)


def _store(args: argparse.Namespace):
    from ..store.artifacts import ArtifactStore

    return ArtifactStore(args.cache_dir)


def _summary(u) -> str:
    arts = [e for e in u.entries if e.kind == "artifact"]
    prods = [e for e in u.entries if e.kind != "artifact"]
    kept = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in u.kept.items() if v)
    return (f"store {u.root}: {fmt_bytes(u.total_bytes)} — {len(arts)} artifact(s) "
            f"{fmt_bytes(sum(e.bytes for e in arts))}, {len(prods)} build product(s) "
            f"{fmt_bytes(sum(e.bytes for e in prods))}" + (f"; kept: {kept}" if kept else ""))


def _row(e) -> str:
    return f"  {e.name[:12]}  {e.kind:13}  {e.what[:40]:40}  {fmt_bytes(e.bytes):>10}"


def _links(links, what: str) -> list[str]:
    if not links:
        return []
    return ([f"{len(links)} symlink(s) in the store {what}:"]
            + [f"  {link.path} -> {link.target[:200]!r}" for link in links])


def run_list(args: argparse.Namespace) -> int:
    from ..store.prune import usage

    u = usage(_store(args))
    now = time.time()
    rows = u.entries if args.limit <= 0 else u.entries[:args.limit]
    lines = [_summary(u)]
    if rows:
        lines.append(f"  {'KEY':12}  {'KIND':13}  {'WHAT':40}  {'SIZE':>10}  LAST USED")
        lines += [f"{_row(e)}  {fmt_age(now - e.last_used)} ago" for e in rows]
    if len(rows) < len(u.entries):
        lines.append(f"  … {len(u.entries) - len(rows)} more (--limit 0 lists all)")
    lines += _links(u.links, "(never followed: the store writes none; hwb store prune removes "
                             "those below objects/, build-cache/, tmp/ and locks/)")
    lines.append("remove the least recently used: hwb store prune --max-size SIZE / --older-than AGE")
    emit(args, u.to_dict(), "\n".join(lines))
    return 0


def run_prune(args: argparse.Namespace) -> int:
    from ..store.prune import GRACE_S, prune

    if args.max_size is None and args.older_than is None:  # a usage error: argparse's exit 2
        args.prune_parser.error("say what to keep: give --max-size SIZE (e.g. 2G) and/or "
                                "--older-than AGE (e.g. 30d)")
    r = prune(_store(args), max_bytes=args.max_size, older_than_s=args.older_than,
              dry_run=args.dry_run)
    verb = "would remove" if r.dry_run else "removed"
    n_art = sum(e.kind == "artifact" for e in r.removed)
    lines = [f"{verb} {n_art} artifact(s) and {len(r.removed) - n_art} build product(s), "
             f"{fmt_bytes(sum(e.bytes for e in r.removed))}"
             + (f"; {r.locks_removed} idle lock file(s)" if r.locks_removed else "")]
    lines += [_row(e) for e in r.removed]
    if r.kept_recent:
        lines.append(f"kept {r.kept_recent} entr{'y' if r.kept_recent == 1 else 'ies'} over the "
                     f"limit: used in the last {GRACE_S:.0f} s")
    lines += _links(r.links_removed, "removed (the links; nothing they name was followed)")
    lines += _links(r.after.links, "left in place (never followed; remove them yourself)")
    lines.append(("would leave " if r.dry_run else "") + _summary(r.after))
    emit(args, r.to_dict(), "\n".join(lines))
    return 0
