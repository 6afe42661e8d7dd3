"""`addnorm check FILE.py:NAME`: ✅/❌ per check with a hint, exit status 1 on any failure."""

from __future__ import annotations

from rich.console import Console


def add_parser(sub) -> None:
    p = sub.add_parser("check", help="validate your own LayerNorm / RMSNorm / residual implementation")
    p.add_argument("target", help="FILE.py:NAME -- an nn.Module class or instance, a NumPy/torch function, a MAX module")
    p.add_argument("--features", type=int, default=768, help="feature size to test with (default %(default)s)")


def run(args) -> int:
    from ..check import check_target, load_target

    console = Console(highlight=False)
    try:
        target = load_target(args.target)
        adapted, results = check_target(target, args.features)
    except (ValueError, FileNotFoundError, AttributeError, TypeError, ImportError) as e:
        console.print(f"❌ could not check {args.target}: {e}")
        return 2
    console.print(f"Checking {args.target}: {adapted.description}\n")
    for r in results:
        mark = "✅" if r.ok else "❌"
        console.print(f"{mark} {r.name}" + (f"  [dim]({r.detail})[/dim]" if r.detail else ""))
        if not r.ok and r.hint:
            console.print(f"   Hint: {r.hint}")
    failed = sum(not r.ok for r in results)
    console.print("\n" + ("🎉 All checks passed!" if not failed else f"⚠️  {failed} check(s) failed. Review the hints above."))
    return 1 if failed else 0
