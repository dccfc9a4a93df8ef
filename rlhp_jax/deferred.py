"""Modules that stand in ``sys.modules`` until they are used (layer 0: start-up plumbing).

Imports the project's runs never need, and would pay for at every start, go through here:

* gymnax imports every environment it has, and with them seaborn and ``matplotlib.pyplot`` for
  its own rendering, which this project never calls (~1.6 s: seaborn pulls in scipy.stats and
  pandas).  ``envs.import_gymnax`` defers them (:func:`import_module`).
* tensorboardX imports PyTorch when it is installed, for a type annotation (1.2-1.3 s on a 2-core
  CPU), and boto3 and Google Cloud Storage for ``s3://`` and ``gs://`` log directories (boto3:
  ~0.2 s).  ``metrics.TensorBoardWriter`` imports it with PyTorch blocked and the other two
  deferred (:func:`import_module`).
* XLA:CPU's LAPACK routines (the orthogonal initializer's QR) are bound by importing SciPy's
  ``scipy.linalg.cython_blas`` and ``cython_lapack`` for their function pointers, and importing
  them runs all of ``scipy.linalg``'s ``__init__`` (~0.15 s of a warm start's 2 s, on the thread
  that reads the compiled programs).  :func:`load_extensions` loads the two extension modules
  alone, under a deferred ``scipy.linalg``.

A deferred module is a placeholder until one of its attributes is read; then the real module is
imported (by whoever uses it: the learning-curve plot loads pyplot as it always did) and takes the
placeholder's place, and the placeholder's namespace becomes the real one's, for the importers
that hold it.  ``importlib.util.LazyLoader`` cannot do this: an ``import`` statement reads the
module's ``__spec__``, which loads it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


class Deferred(types.ModuleType):
    """Stands in ``sys.modules`` for a module not yet imported; the first read of an attribute it
    lacks imports the real one, puts it in the placeholder's place and copies its namespace into
    the placeholder (which the importers that ran meanwhile hold)."""

    def __getattr__(self, attr: str):  # only for names the placeholder lacks
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
        real = importlib.import_module(name)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, real)
        self.__dict__.update(vars(real))
        return getattr(real, attr)


def defer(name: str) -> Deferred | None:
    """Put a placeholder for module ``name`` in ``sys.modules`` (its parent package is imported,
    since ``import a.b as c`` reads b as an attribute of a); None if ``name`` is imported already."""
    if name in sys.modules:
        return None
    parent, _, child = name.rpartition(".")
    if parent:
        importlib.import_module(parent)
    placeholder = Deferred(name)
    sys.modules[name] = placeholder
    if parent:
        setattr(sys.modules[parent], child, placeholder)
    return placeholder


def load_extensions(package: str, names: tuple[str, ...]) -> bool:
    """Import the submodules ``names`` of ``package`` without running the package's ``__init__``:
    the package stands deferred (:func:`defer`), with its path for the finder and each submodule
    as an attribute.  For compiled extension modules that import nothing of their package.  Does
    nothing once the package is imported; False when a submodule is not found (the caller's
    ordinary import then does the work)."""
    if package in sys.modules:
        return False
    top = importlib.util.find_spec(package)
    if top is None or not top.submodule_search_locations:
        return False
    placeholder = defer(package)
    placeholder.__path__ = list(top.submodule_search_locations)
    try:
        for name in names:
            spec = importlib.util.find_spec(f"{package}.{name}")
            if spec is None or spec.loader is None:
                return False
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            setattr(placeholder, name, module)
    except Exception:
        for name in names:
            sys.modules.pop(f"{package}.{name}", None)
        return False
    return True


def installed(name: str) -> bool:
    """Whether module ``name`` can be imported (its parent packages are imported to find out)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent missing, or a placeholder without a spec
        return False


def import_module(name: str, deferring: tuple[str, ...] = (), blocking: tuple[str, ...] = ()):
    """Import module ``name`` with each module of ``deferring`` that is installed and not yet
    imported standing deferred (:func:`defer`), and each of ``blocking`` not yet imported made
    unimportable while it runs: for optional imports that ``name`` only probes (``try: import x``)
    and reads an attribute of at once, so a placeholder would not stay one.  A blocked module is
    importable again as soon as this returns; meanwhile it is blocked for every thread, so call
    this where no other thread imports it (the entry points' main thread, opening a run)."""
    if name in sys.modules:
        return sys.modules[name]
    for other in deferring:
        if other not in sys.modules and installed(other):
            defer(other)
    blocked = [other for other in blocking if other not in sys.modules]
    for other in blocked:
        sys.modules[other] = None  # ``import other`` raises ImportError
    try:
        return importlib.import_module(name)
    finally:
        for other in blocked:
            if sys.modules.get(other, 0) is None:
                del sys.modules[other]

