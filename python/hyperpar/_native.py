"""ctypes over libhyperpar_c.so: one call, JSON in, text out (include/hyperpar/api.h)."""
import ctypes
import json
import os

_lib = None


class Error(Exception):
    """A refusal of the C library: the same message (and meaning) as the CLI's exit code 2."""

    def __init__(self, message, code=2):
        super().__init__(message)
        self.code = code
        self.report = None  # advise: the report printed beside the refusal


def _candidates():
    env = os.environ.get("HYPERPAR_LIB")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "libhyperpar_c.so")
    root = os.path.dirname(os.path.dirname(here))  # a checkout: python/hyperpar -> repository root
    for build in ("build", "build-python"):
        yield os.path.join(root, build, "libhyperpar_c.so")


def lib():
    global _lib
    if _lib is None:
        tried = []
        for path in _candidates():
            if os.path.exists(path):
                _lib = ctypes.CDLL(path)
                break
            tried.append(path)
        else:
            raise ImportError("hyperpar: libhyperpar_c.so not found (tried %s); install the package with "
                              "`pip install ./python` or set HYPERPAR_LIB" % ", ".join(tried))
        _lib.hp_api_call.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]
        _lib.hp_api_call.restype = ctypes.c_int
        _lib.hp_api_free.argtypes = [ctypes.c_void_p]
        _lib.hp_api_free.restype = None
    return _lib


def call(request):
    """Sends one request (a dict) and returns the reply text; raises Error with the C message on refusal."""
    lb = lib()
    out = ctypes.c_void_p()
    err = ctypes.c_void_p()
    code = lb.hp_api_call(json.dumps(request).encode(), ctypes.byref(out), ctypes.byref(err))
    try:
        text = ctypes.string_at(out.value).decode() if out.value else ""
        msg = ctypes.string_at(err.value).decode() if err.value else ""
    finally:
        lb.hp_api_free(out.value)
        lb.hp_api_free(err.value)
    if code != 0:
        e = Error(msg or "hyperpar: the request failed", code)
        if text:
            try:
                e.report = json.loads(text)
            except ValueError:
                e.report = text
        raise e
    return text
