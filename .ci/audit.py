"""pip-audit over the lock files: fails on a known vulnerability not in .ci/audit-ignore.txt.

Each ignore line is `<VULN-ID> <YYYY-MM-DD> <reason>`: an ignore without a date and a reason is
refused, and an ignore older than 90 days is reported so it is looked at again. When no
vulnerability service answers (a machine without the PyPI JSON API or OSV), the audit says so and
passes, unless AUDIT_STRICT=1.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

IGNORE_FILE = Path(__file__).with_name("audit-ignore.txt")


def _ignores() -> list[str]:
    ids: list[str] = []
    if not IGNORE_FILE.exists():
        return ids
    today = dt.date.today()
    for raw in IGNORE_FILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(maxsplit=2)
        if len(parts) < 3:
            sys.exit(f"audit-ignore.txt: '{line}' needs an id, a date and a reason")
        vuln, date, _reason = parts
        if (today - dt.date.fromisoformat(date)).days > 90:
            print(f"audit: the ignore of {vuln} is older than 90 days: look at it again")
        ids.append(vuln)
    return ids


def main(paths: list[str]) -> int:
    ignores = _ignores()
    unaudited = 0
    found = 0
    for path in paths:
        cmd = [
            sys.executable,
            "-m",
            "pip_audit",
            "-r",
            path,
            "--require-hashes",
            "--disable-pip",
            "--progress-spinner",
            "off",
            "--format",
            "json",
        ]
        for vuln in ignores:
            cmd += ["--ignore-vuln", vuln]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        try:
            report = json.loads(proc.stdout)
        except json.JSONDecodeError:
            print(f"audit: {path}: pip-audit gave no report ({proc.stderr.strip()[-300:]})")
            unaudited += 1
            continue
        deps = report.get("dependencies", [])
        skipped = [d for d in deps if "skip_reason" in d]
        vulnerable = [d for d in deps if d.get("vulns")]
        for dep in vulnerable:
            for vuln in dep["vulns"]:
                print(
                    f"audit: {dep['name']} {dep['version']}: {vuln['id']} "
                    f"(fixed in {', '.join(vuln.get('fix_versions') or ['-'])})"
                )
        found += len(vulnerable)
        if deps and len(skipped) == len(deps):
            unaudited += 1
            print(f"audit: {path}: no vulnerability service answered; nothing was audited")
        else:
            print(
                f"audit: {path}: {len(deps) - len(skipped)} packages audited, "
                f"{len(vulnerable)} with known vulnerabilities"
            )
    if found:
        return 1
    if unaudited and os.environ.get("AUDIT_STRICT") == "1":
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
