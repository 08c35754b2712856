"""The one skip rule of the Python tests: a test that cannot run here (torch, transformers or accelerate do not
import) exits 77, which ctest counts as skipped; under torchrun it also writes the reason to $HP_SKIP_FILE, since
torchrun reports a child's 77 as its own failure (torchrun_test.sh turns it back into 77). With HP_REQUIRE_TORCH=1
(CI) it fails instead."""
import os
import sys


def skip(who, why):
    if os.environ.get("HP_REQUIRE_TORCH") == "1":
        print("%s: FAIL: %s (HP_REQUIRE_TORCH=1)" % (who, why), flush=True)
        sys.exit(1)
    print("%s: SKIP: %s" % (who, why), flush=True)
    if os.environ.get("HP_SKIP_FILE"):
        with open(os.environ["HP_SKIP_FILE"], "w") as f:
            f.write(why)
    sys.exit(77)


def end(code):
    """Ends a torchrun test process with code once its process groups are destroyed: output flushed, then
    os._exit, so that the interpreter's teardown (torch's and gloo's C++ destructors, run in no fixed order after
    the groups are gone) cannot turn a finished test into an abort; it was seen once in CI ('terminate called
    without an active exception' after every case had passed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)
