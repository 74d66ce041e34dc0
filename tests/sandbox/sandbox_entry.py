"""Entries for sandbox tests (stdlib only: cheap for the child to import).

``tests/sandbox`` is on ``sys.path``, which the child inherits.
"""


def call_score(payload):
    """The call that runs ``payload["source"]`` and returns its ``score(payload["xs"])``."""
    def call():
        namespace = {}
        code = compile(payload["source"], "<candidate>", "exec")
        exec(code, namespace)  # pylint: disable=exec-used
        return namespace["score"](payload["xs"])
    return call


def fail_setup(payload):
    """A set-up that raises before anything is sandboxed."""
    raise RuntimeError(f"no set-up for {payload!r}")
