"""Code problems, as verl scores ``codecontests``, ``apps``, ``codeforces`` and ``taco`` without a sandbox-fusion
server (``verl.utils.reward_score.prime_code``, ``continuous=True``): the share of the first 10 test cases the program
passes (1.0 when it passes them all).

The program is the completion's last ```` ```python ```` block (the whole completion without one). It runs in plugrl's
sandbox (:func:`plugrl_tools.sandbox.run_python`: a fresh isolated interpreter per test case, standard library
only, CPU, memory and wall-clock limits), never in the trainer or a reward worker. Each test case is one of:

* **standard input** (no ``fn_name`` in the ground truth): the input on stdin, the printed output compared as verl
  compares it (the whole text trimmed; line by line trimmed; without blank lines; as numbers within numpy's
  ``allclose`` when not all integers);
* **call-based** (``fn_name``): the function (or ``Solution().fn_name``) called with the JSON inputs, one argument per
  line, its result compared with the JSON output (or its first element; tuples as lists).

Like verl, the program starts with the standard library's common names imported (``from math import *``, ...).
Differences from verl: the program runs as a script (verl wraps it in a function), with the sandbox's standard library
only (a solution importing numpy fails here), and stdin is a real stream.
"""

from __future__ import annotations

import json
import math
from typing import Any

from plugrl_tools.sandbox import SandboxLimits, run_python

MAX_TESTS = 10  # verl scores the first 10 test cases
TEST_LIMITS = SandboxLimits(cpu_s=10, wall_s=12, memory_mb=1024, output_chars=1_000_000)  # verl: 10 s a test case
MARK = "<<plugrl-verl-result>>"
# what verl puts before every program
PRELUDE = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\n"
    "from statistics import *\nfrom itertools import *\nfrom functools import *\nfrom operator import *\n"
    "from io import *\nfrom sys import *\nfrom json import *\nfrom builtins import *\nfrom typing import *\n"
    "import string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\n"
    "import math\nimport random\nimport statistics\nimport itertools\nimport functools\nimport operator\n"
    "import io\nimport sys\nimport json\nsys.setrecursionlimit(6*10**5)\n"
)
# a call-based test: the program's own prints are dropped; the result, tagged, is the last line of stdout
CALL = """
import json as _plugrl_json, io as _plugrl_io, sys as _plugrl_sys
_plugrl_out = _plugrl_sys.stdout
_plugrl_sys.stdout = _plugrl_io.StringIO()
exec(compile({source!r}, "<string>", "exec"), _plugrl_globals := {{"__name__": "tmp_sol"}})
_plugrl_fn = (_plugrl_globals["Solution"]() if {solution_class!r} else None)
_plugrl_fn = getattr(_plugrl_fn, {fn_name!r}) if _plugrl_fn is not None else _plugrl_globals[{fn_name!r}]
_plugrl_args = {args!r}
_plugrl_args = [_plugrl_json.loads(line) for line in _plugrl_args.split("\\n")]
try:
    if isinstance(_plugrl_args[0], dict):
        _plugrl_args = [{{int(k): v for k, v in _plugrl_args[0].items()}}]
except Exception:
    pass
_plugrl_result = _plugrl_fn(*_plugrl_args)
_plugrl_json.dumps(_plugrl_result)  # verl: a result JSON cannot hold fails the test


def _plugrl_tag(value):
    if isinstance(value, tuple):
        return {{"tuple": [_plugrl_tag(v) for v in value]}}
    if isinstance(value, list):
        return [_plugrl_tag(v) for v in value]
    if isinstance(value, dict):
        return {{"dict": [[_plugrl_tag(k), _plugrl_tag(v)] for k, v in value.items()]}}
    return value


_plugrl_out.write("\\n" + {mark!r} + _plugrl_json.dumps(_plugrl_tag(_plugrl_result)) + "\\n")
"""


def program(completion: str) -> str:
    """The code verl runs: the last ```` ```python ```` block's content, or the completion itself."""
    return completion.split("```python")[-1].split("```")[0]


def _untag(value: Any) -> Any:
    if isinstance(value, list):
        return [_untag(v) for v in value]
    if isinstance(value, dict) and set(value) == {"tuple"}:
        return tuple(_untag(v) for v in value["tuple"])
    if isinstance(value, dict) and set(value) == {"dict"}:
        return {_untag(k): _untag(v) for k, v in value["dict"]}
    return value


def _int_keys(expected: Any) -> Any:
    """verl turns JSON's string keys back into ints (a dict output, or one in a list)."""
    for probe in (expected, expected[0] if isinstance(expected, list) and expected else None):
        if isinstance(probe, dict):
            try:
                return [{int(k): v for k, v in probe.items()}]
            except (TypeError, ValueError):
                pass
    return expected


def call_result_matches(result: Any, expected: Any) -> bool:
    """verl's comparison of a call-based result with the expected output (already JSON-decoded)."""
    if isinstance(result, tuple):
        result = list(result)
    right = result == expected
    if isinstance(expected, list) and expected:
        right = right or result == expected[0]
    try:
        if isinstance(result[0], tuple):
            right = right or [list(x) for x in result] == expected[0]
    except Exception:
        pass
    return right is True


def _allclose(got: list[float], want: list[float]) -> bool:
    """numpy.allclose's test (rtol 1e-5, atol 1e-8), element by element."""
    if len(got) != len(want):
        return False
    for a, b in zip(got, want, strict=True):
        if math.isinf(a) or math.isinf(b):
            if a != b:
                return False
        elif not abs(a - b) <= 1e-8 + 1e-5 * abs(b):  # NaN: not close
            return False
    return True


def _is_int_text(value: Any) -> bool:
    return isinstance(value, int) or (isinstance(value, str) and value.isdigit())


def stdout_matches(stdout: str, expected: Any) -> bool:
    """verl's comparison of a program's printed output with the expected text (see the module doc)."""
    if isinstance(expected, list):
        expected = "\n".join(expected)
    lines = stdout.splitlines()
    if "\n".join(lines).strip() == expected.strip() or "\n".join(x.strip() for x in lines).strip() == expected.strip():
        return True
    want = [x.strip() for x in expected.split("\n") if x]
    if lines == [want] or lines == want:
        return True
    lines = [x for x in lines if x]
    if lines == want:
        return True
    try:
        ints = all(_is_int_text(a) and _is_int_text(b) for a, b in zip(lines, want, strict=False))
        if len(lines) == len(want) and not ints:
            return _allclose([float(x) for x in lines], [float(x) for x in want])
    except ValueError:
        pass
    return False


def run_case(code: str, tests: dict[str, Any], index: int) -> bool:
    """Whether the program passes test case ``index`` of ``tests`` (``inputs``, ``outputs``, maybe ``fn_name``)."""
    inputs, expected = tests["inputs"][index], tests["outputs"][index]
    fn_name = tests.get("fn_name")
    if fn_name is None:
        stdin = "\n".join(inputs) if isinstance(inputs, list) else str(inputs)
        result = run_python(PRELUDE + code + "\npass\n", TEST_LIMITS, stdin=stdin)
        return result.status == "ok" and stdout_matches(result.stdout, expected)
    harness = CALL.format(
        source=PRELUDE + code, solution_class="class Solution" in code, fn_name=fn_name, args=inputs, mark=MARK
    )
    result = run_python(harness, TEST_LIMITS)
    tagged = [line for line in result.stdout.splitlines() if line.startswith(MARK)]
    if result.status != "ok" or not tagged:
        return False
    try:
        got = _untag(json.loads(tagged[-1][len(MARK) :]))
        want = _int_keys(json.loads(expected))
    except ValueError:
        return False
    return call_result_matches(got, want)


def code_score(completion: str, ground_truth: Any) -> dict[str, Any]:
    """The share of the first :data:`MAX_TESTS` test cases passed (1.0 for no test cases, as verl); ``passed`` and
    ``tests`` beside it. ``ground_truth``: ``{"inputs": [...], "outputs": [...], "fn_name"?: name}`` or its JSON."""
    tests = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    count = min(MAX_TESTS, len(tests["inputs"]))
    if count == 0:
        return {"score": 1.0, "passed": 0, "tests": 0}
    code = program(completion)
    passed = sum(run_case(code, tests, i) for i in range(count))
    return {"score": passed / count, "passed": passed, "tests": count}
