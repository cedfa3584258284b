"""The Python session tests/test_readme.py runs the README's Python snippets in, as a user pasting them one after the
other into one interpreter would (each sees the names the ones before it made):

    .venv/bin/python tests/readme_session.py

reads one request per line on stdin, ``{"code": ..., "where": "README.md, line N"}``, runs the code in the session's
namespace, and answers on stdout one line, ``{"ok": true}`` or ``{"ok": false, "error": TRACEBACK}``. What the
snippets print goes to stderr.
"""

from __future__ import annotations

import json
import sys
import traceback


def main() -> None:
    answers, sys.stdout = sys.stdout, sys.stderr
    namespace: dict[str, object] = {"__name__": "__main__"}
    for line in sys.stdin:
        request = json.loads(line)
        try:
            exec(compile(request["code"], request["where"], "exec"), namespace)
            answer: dict[str, object] = {"ok": True}
        except BaseException:  # the snippet's failure is the answer, whatever it is
            answer = {"ok": False, "error": traceback.format_exc()}
        sys.stderr.flush()
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
