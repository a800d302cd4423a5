"""A derivation cache: the search's programs for an expression, kept across compiles and models.

The search (:func:`~tvm_ollie.derive.search.derive`) is most of an untuned compile, and the same
operator signature recurs across models (a 3x3 conv of 64 channels at 56x56, a 768x768
matmul). :class:`DerivationCache` stores what a search returned for one lifted expression and
hands it back the next time the same expression is derived, in this process or another.

What is cached: the candidate programs as the search returned them, **before** the unit's
checks and costing. Verification against the Relax unit, the cost estimates and the timings
depend on the target, the library and the machine, and must run again anyway (a cached program
is checked like any other candidate); the search depends only on the expression, the rules
and the search limits, which is what the key holds:

* the expression, with its input tensors renamed by position (``X0, X1, ..`` in order of first
  read) and put in canonical form (:func:`~.canon.canonicalize`), printed
  (:func:`tvm_ollie.ir.printer.to_text`, with every tensor's shape and dtype): two models whose
  operators read differently named tensors share entries;
* the rule-set version (:func:`rules_version`): a hash of the source of the ``derive`` and ``ir``
  packages (rules, matching, instantiation, canonical form, simplification) and of the rule
  names, so that any change to a rule makes every old entry a miss;
* the limits that shape the result: ``max_depth``, ``targets``, ``max_states``,
  ``max_candidates`` and the cost target that ranks the programs. The time budget is not part of
  the key: a result is reused whatever the budget (clear the cache to search again longer).
  Nor is the early stop near the roofline bound (:class:`~.search.CostBound`): like the budget
  it only ends a search sooner, and its bound depends on the machine's calibration, which
  would make every key differ from one process to the next.

Programs are stored as JSON text: the expressions of all of an entry's programs as one table of
nodes (the hash-consed DAG: a sub-expression shared by many programs is stored and rebuilt once,
by the constructor that unpickling uses), attributes through ``repr`` / ``ast.literal_eval``.
Not the printer's text (``parse(to_text(e)) is e`` holds too): the parser took about 7 ms per
expression and an entry holds hundreds (every stage, rule step and derived form of up to ~50
programs), seconds per lookup; the table reads back in milliseconds and needs no code
execution (unlike pickle). An entry is written only when every program reads back to the very
same nodes, so a program the form cannot carry is searched again rather than approximated.

Where: ``<work_dir>/derivations`` when a work dir is given, and the per-user directory
(``$TVM_OLLIE_CACHE_DIR``, else ``$XDG_CACHE_HOME/tvm_ollie`` or ``~/.cache/tvm_ollie``, then
``derivations``); ``TVM_OLLIE_CACHE_DIR=`` (empty) turns the per-user one off. Each directory is
bounded (``TVM_OLLIE_CACHE_MAX_MB``, default 256): past it, the least recently used entries
go. Entries are written to a temporary file and renamed into place (readers and concurrent
writers see whole files); a truncated or corrupt entry is ignored with one warning, removed and
written again after the search; a directory that cannot be written is skipped with one warning
and never fails a compile.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..ir.nodes import (Access, BinOp, Call, Const, IterVar, Node, Scope, Tensor, Var,
                        input_tensors)
from ..ir.printer import to_text
from ..ir.rewrite import rewrite
from .canon import canonicalize
from .collector import collector_paused
from .program import Program, Stage, Step
from .rules import ALL_RULES, SEARCH_RULES

__all__ = ["CACHE_ENV", "CachedSearch", "DerivationCache", "EntryStore", "dump_program",
           "load_program", "rules_version", "run_dirs", "user_cache_dir"]

LOG = logging.getLogger(__name__)

#: Environment variable of the per-user cache directory (empty: no per-user cache).
CACHE_ENV = "TVM_OLLIE_CACHE_DIR"
#: Environment variable of each cache directory's size bound, in MiB.
MAX_MB_ENV = "TVM_OLLIE_CACHE_MAX_MB"
DEFAULT_MAX_MB = 256
#: Layout of an entry; bump when the stored fields change.
ENTRY_FORMAT = 1
_SUBDIR = "derivations"
_PREFIX = "X"  # canonical input names: X0, X1, ...
_WARNED: set = set()  # (kind, path) already warned about, once per process


def user_cache_dir(subdir: str = _SUBDIR) -> Optional[str]:
    """The per-user directory of a cache (``subdir``: the derivation cache's by default), or
    None when ``TVM_OLLIE_CACHE_DIR`` is empty."""
    env = os.environ.get(CACHE_ENV)
    if env is not None:
        return os.path.join(os.path.expanduser(env), subdir) if env.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tvm_ollie", subdir)


def run_dirs(work_dir: Optional[str], subdir: str) -> List[str]:
    """A compile's directories of a cache: ``<work_dir>/<subdir>`` (if given), then the
    per-user one (if on)."""
    dirs = [os.path.join(work_dir, subdir)] if work_dir else []
    user = user_cache_dir(subdir)
    if user:
        dirs.append(user)
    return dirs


class EntryStore:
    """JSON entries by digest, in a few directories: the storage of the on-disk caches.

    Every entry is a JSON object whose ``"key"`` is the full key text it was stored under (a
    reader compares it: a digest collision or an older layout is a miss). Reads go through the
    directories in order (first hit wins), writes go to every one, atomically (a temporary
    file renamed into place: readers and concurrent writers see whole files). A corrupt entry
    (unreadable JSON, or one the caller's ``decode`` rejects by raising) is ignored with one
    warning and removed; a directory that cannot be written is skipped with one warning. Each
    directory is bounded by ``max_bytes``, the least recently used entries going first.

    Parameters
    ----------
    dirs : sequence of str
        Directories to read and write.
    max_bytes : int, optional
        Size bound of each directory (default ``TVM_OLLIE_CACHE_MAX_MB`` MiB, else 256 MiB).
    what : str
        The cache's name in warnings.
    """

    def __init__(self, dirs: Sequence[str], max_bytes: Optional[int] = None,
                 what: str = "derivation cache"):
        self.dirs = [d for d in dict.fromkeys(dirs) if d]
        if max_bytes is None:
            max_bytes = int(float(os.environ.get(MAX_MB_ENV) or DEFAULT_MAX_MB) * 2 ** 20)
        self.max_bytes = max_bytes
        self.what = what

    def load(self, digest: str, material: str, decode=lambda entry: entry):
        """``decode(entry)`` of the first entry stored under ``digest`` with key ``material``
        (None when there is none, or ``decode`` returns None everywhere)."""
        for folder in self.dirs:
            path = os.path.join(folder, digest + ".json")
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except OSError:  # absent (or evicted meanwhile), or unreadable: a miss
                continue
            try:
                entry = json.loads(data.decode("utf-8"))
                if entry.get("key") != material:  # another format, or a digest collision
                    continue
                found = decode(entry)
            except Exception as err:  # pylint: disable=broad-except
                _warn_once("corrupt", path, "ollie: ignoring a corrupt %s entry %s (%s: %s); "
                           "it is computed again", self.what, path, type(err).__name__,
                           str(err)[:120])
                _remove(path)
                continue
            if found is not None:
                _touch(path)
                return found
        return None

    def store(self, digest: str, entry: Mapping[str, object]) -> bool:
        """Write ``entry`` (a JSON-able mapping with its ``"key"``) under ``digest`` in every
        directory; False when no directory took it."""
        payload = json.dumps(dict(entry))
        wrote = False
        for folder in self.dirs:
            if _write(folder, digest + ".json", payload, self.what):
                wrote = True
                self._evict(folder)
        return wrote

    def _evict(self, folder: str) -> None:
        """Remove the least recently used entries until ``folder`` holds ``max_bytes``."""
        try:
            entries = []
            with os.scandir(folder) as it:
                for e in it:
                    if e.name.endswith(".json") and e.is_file():
                        st = e.stat()
                        entries.append((st.st_mtime, st.st_size, e.path))
        except OSError:
            return
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            if _remove(path):
                total -= size


@functools.lru_cache(maxsize=1)
def rules_version() -> str:
    """A hash of every rule's name and of the ``derive`` and ``ir`` packages' source (all but
    this module, whose entry layout :data:`ENTRY_FORMAT` versions).

    The source, not a hand-kept version constant: a rule (or the matcher, the instantiation,
    the canonical form) edited without bumping a constant would otherwise serve stale programs.
    """

    digest = hashlib.sha256()
    digest.update(",".join(r.name for r in ALL_RULES).encode())
    digest.update(b"|" + ",".join(r.name for r in SEARCH_RULES).encode())
    here = os.path.dirname(os.path.abspath(__file__))
    for root in (here, os.path.join(os.path.dirname(here), "ir")):
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                if path == os.path.abspath(__file__):
                    continue  # (this module reads and writes entries: ENTRY_FORMAT versions it)
                digest.update(os.path.relpath(path, os.path.dirname(root)).encode())
                with open(path, "rb") as fh:
                    digest.update(fh.read())
    return digest.hexdigest()[:16]


@dataclass
class CachedSearch:
    """A search result read back: its programs (over the caller's tensor names), why the
    search that produced them stopped, and the time budget it had."""

    programs: List[Program]
    stop: str
    budget_s: Optional[float]


class DerivationCache:
    """Search results by expression (see the module docstring).

    Parameters
    ----------
    dirs : sequence of str
        Directories to read (first hit wins) and write (every one).
    version : str, optional
        The rule-set version in every key (default :func:`rules_version`).
    max_bytes : int, optional
        Size bound of each directory (default ``TVM_OLLIE_CACHE_MAX_MB`` MiB, else 256 MiB).
    """

    def __init__(self, dirs: Sequence[str], version: Optional[str] = None,
                 max_bytes: Optional[int] = None):
        self.store = EntryStore(dirs, max_bytes)
        self.dirs = self.store.dirs
        self.version = version if version is not None else rules_version()
        self.max_bytes = self.store.max_bytes
        #: lookups that found an entry / did not / entries written
        self.hits = self.misses = self.stores = 0

    @classmethod
    def for_run(cls, work_dir: Optional[str] = None) -> "DerivationCache":
        """The cache of a compile: ``<work_dir>/derivations`` (if given) and the per-user one."""
        return cls(run_dirs(work_dir, _SUBDIR))

    # -- keys --------------------------------------------------------------------------------

    def key(self, expr: Scope, limits: Mapping[str, object]) -> Tuple[str, str, Dict[str, str]]:
        """``(digest, key text, {input name: canonical name})`` of ``expr`` under ``limits``."""
        names = {t.name: f"{_PREFIX}{k}" for k, t in enumerate(input_tensors(expr))}
        text = to_text(canonicalize(_rename(expr, names)))
        material = json.dumps({"format": ENTRY_FORMAT, "rules": self.version, "expr": text,
                               "limits": _plain(limits)}, sort_keys=True)
        return hashlib.sha256(material.encode()).hexdigest(), material, names

    def _key_or_none(self, expr: Scope, limits: Mapping[str, object]):
        """:meth:`key`, or None when ``expr`` cannot be keyed (then it is simply searched)."""
        try:
            return self.key(expr, limits)
        except Exception as err:  # pylint: disable=broad-except
            LOG.debug("ollie: no derivation cache key (%s: %s)", type(err).__name__, err)
            return None

    # -- lookups -----------------------------------------------------------------------------

    def get(self, expr: Scope, limits: Mapping[str, object]) -> Optional[CachedSearch]:
        """The stored result for ``expr`` (its programs over ``expr``'s names), or None."""
        if not self.dirs:
            return None
        keyed = self._key_or_none(expr, limits)
        if keyed is None:
            self.misses += 1
            return None
        digest, material, names = keyed
        back = {v: k for k, v in names.items()}
        with collector_paused():  # the programs' nodes, rebuilt (:mod:`.collector`)
            found = self.store.load(digest, material, lambda entry: _decode(entry, back, expr))
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    def put(self, expr: Scope, limits: Mapping[str, object], programs: Sequence[Program],
            stop: str = "", budget_s: Optional[float] = None) -> bool:
        """Store ``programs`` (a search's result for ``expr``); False when nothing was written
        (no directory, a program the text form cannot carry exactly, or no writable place)."""
        if not self.dirs:
            return False
        keyed = self._key_or_none(expr, limits)
        if keyed is None:
            return False
        digest, material, names = keyed
        try:
            with collector_paused():  # the text form and its round trip (:mod:`.collector`)
                stored = _dump_checked(programs, names, expr)
        except Exception as err:  # pylint: disable=broad-except
            LOG.debug("ollie: derivation not cached (%s: %s)", type(err).__name__, err)
            return False
        if stored is None:
            return False
        wrote = self.store.store(digest, {"key": material, "stop": stop, "budget_s": budget_s,
                                          **stored})
        self.stores += wrote
        return wrote


def _dump_checked(programs: Sequence[Program], names: Mapping[str, str],
                  expr: Scope) -> Optional[dict]:
    """The text form of ``programs`` (tensors renamed by ``names``), or None when a stage name
    would shadow an input or a program does not read back as itself."""
    back = {v: k for k, v in names.items()}
    stored = _dump_programs(programs, names)
    if set(names.values()) & {s["name"] for p in stored["programs"] for s in p["stages"]}:
        return None
    for prog, back_prog in zip(programs, _load_programs(stored, back, expr)):
        if not _same_program(prog, back_prog):
            LOG.debug("ollie: %r does not round-trip; not cached", prog)
            return None
    return stored


def _decode(entry: Mapping, back: Dict[str, str], expr: Scope) -> Optional[CachedSearch]:
    """The search result an entry holds, over ``expr``'s names (None: it does not fit)."""
    if set(back.values()) & {s["name"] for p in entry["programs"] for s in p["stages"]}:
        return None  # a stage name would shadow one of this expression's inputs
    programs = _load_programs(entry, back, expr)
    return CachedSearch(programs, str(entry.get("stop", "")), entry.get("budget_s"))


# -- text form of programs ---------------------------------------------------------------------


def _rename(node: Node, names: Mapping[str, str]) -> Node:
    """``node`` with its tensors named by ``names`` (others kept; shapes, padding kept)."""

    def tensor(t: Tensor) -> Tensor:
        new = names.get(t.name)
        return t if new is None else Tensor(new, t.shape, t.dtype, t.pad, t.pad_value)

    def post(cur: Node) -> Optional[Node]:
        if isinstance(cur, Tensor):
            return tensor(cur)
        if isinstance(cur, Access) and isinstance(cur.source, Tensor):
            src = tensor(cur.source)
            return None if src is cur.source else Access(src, cur.indices)
        return None

    if isinstance(node, Tensor):
        return tensor(node)
    return rewrite(node, post=post)


_NODE_TYPES = {cls.__name__: cls for cls in (Var, Const, BinOp, Call, Tensor, IterVar, Scope,
                                             Access)}


class _NodeTable:
    """The nodes of an entry's programs, each once (children first), tensors renamed.

    A node is ``[type name, fields]`` with its child nodes as ``{"n": index}``: the hash-consed
    DAG as it is, so a sub-expression shared by many programs is stored and rebuilt once, and a
    node is rebuilt by the same constructor (:meth:`Node._make`) that unpickling uses.
    """

    def __init__(self, names: Mapping[str, str]):
        self.names = names
        self.rows: List[list] = []
        self.index: Dict[int, int] = {}  # id(node) -> row

    def ref(self, node: Optional[Node]) -> Optional[int]:
        """The row of ``node`` (added with its children), None for None."""
        if node is None:
            return None
        row = self.index.get(id(node))
        if row is None:
            name = type(node).__name__
            if _NODE_TYPES.get(name) is not type(node):
                raise TypeError(f"cannot store a {name} node")
            args = self._args(node._args)  # pylint: disable=protected-access
            if name == "Tensor":
                args[0] = self.names.get(args[0], args[0])
            row = self.index[id(node)] = len(self.rows)
            self.rows.append([name, args])
        return row

    def _args(self, value):
        if isinstance(value, Node):
            return {"n": self.ref(value)}
        if isinstance(value, tuple):
            return [self._args(v) for v in value]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise TypeError(f"cannot store a field of type {type(value).__name__}")


def _load_nodes(rows: Sequence[list], back: Mapping[str, str]) -> List[Node]:
    """The nodes of a :class:`_NodeTable`'s rows, tensors named back."""
    nodes: List[Node] = []

    def field(value):
        if isinstance(value, list):
            return tuple(field(v) for v in value)
        if isinstance(value, dict):
            return nodes[value["n"]]
        return value

    for name, args in rows:
        fields = list(field(a) for a in args)
        if name == "Tensor":
            fields[0] = back.get(fields[0], fields[0])
        nodes.append(_NODE_TYPES[name]._make(tuple(fields)))  # pylint: disable=W0212
    return nodes


def _dump_programs(programs: Sequence[Program], names: Mapping[str, str]) -> dict:
    table = _NodeTable(names)
    out = []
    for prog in programs:
        if prog.multi:
            raise ValueError("programs of several expressions are not cached")
        out.append({
            "repr": repr(prog),  # (for a reader of the file; not read back)
            "stages": [{"name": s.name, "kind": s.kind, "expr": table.ref(s.expr),
                        "attrs": repr(dict(s.attrs)), "label": s.label} for s in prog.stages],
            "original": table.ref(prog.original),
            "output": prog.output,
            "steps": [{"rule": st.rule, "note": st.note, "expr": table.ref(st.expr)}
                      for st in prog.steps],
            "derived": table.ref(prog.derived),
        })
    return {"nodes": table.rows, "programs": out}


def dump_program(prog: Program) -> dict:
    """``prog`` as JSON-able data (:func:`load_program` reads it back node for node); raises
    ``ValueError``/``TypeError`` when the form cannot carry it exactly (a multi-output
    program, a node or attribute of another type, or one that does not read back the same)."""
    data = _dump_programs([prog], {})
    (back,) = _load_programs(data, {}, prog.original)
    if not _same_program(prog, back):
        raise ValueError("the program does not read back the same")
    return data


def load_program(data: Mapping) -> Program:
    """The program :func:`dump_program` wrote (raises on malformed data)."""
    (prog,) = _load_programs(data, {}, None)
    return prog


def _load_programs(data: Mapping, back: Mapping[str, str],
                   expr: Optional[Scope]) -> List[Program]:
    nodes = _load_nodes(data["nodes"], back)

    def node(ref):
        return None if ref is None else nodes[ref]

    programs = []
    for p in data["programs"]:
        stages = [Stage(s["name"], s["kind"], node(s["expr"]), ast.literal_eval(s["attrs"]),
                        s["label"]) for s in p["stages"]]
        original = node(p["original"])
        if not isinstance(original, Scope) or expr is not None and original.shape != expr.shape:
            raise ValueError("the entry's original expression does not fit")
        steps = [Step(st["rule"], st["note"], node(st["expr"])) for st in p["steps"]]
        programs.append(Program(stages, original, p["output"], steps, node(p["derived"])))
    return programs


def _same_program(a: Program, b: Program) -> bool:
    """Whether ``b`` (read back) is ``a`` node for node (hash-consing makes ``is`` exact)."""
    if len(a.stages) != len(b.stages) or len(a.steps) != len(b.steps):
        return False
    for x, y in zip(a.stages, b.stages):
        if (x.name, x.kind, x.label) != (y.name, y.kind, y.label) or x.expr is not y.expr:
            return False
        if x.attrs != y.attrs or _types(x.attrs) != _types(y.attrs):
            return False
    return (a.original is b.original and a.output == b.output and a.derived is b.derived
            and all((s.rule, s.note) == (t.rule, t.note) and s.expr is t.expr
                    for s, t in zip(a.steps, b.steps)))


def _types(value) -> object:
    """The structure of ``value``'s types (``True == 1``, but a bool must come back a bool)."""
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_types(v) for v in value))
    return type(value)


def _plain(limits: Mapping[str, object]) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in sorted(limits.items())}


# -- files -------------------------------------------------------------------------------------


def _write(folder: str, name: str, payload: str, what: str = "derivation cache") -> bool:
    """Write ``folder/name`` atomically (temporary file, then rename); False on any OSError."""
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".part")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(payload)
        os.replace(tmp, os.path.join(folder, name))
        return True
    except OSError as err:
        _warn_once("unwritable", folder, "ollie: %s %s is not writable (%s); "
                   "compiling without storing there", what, folder, err)
        if tmp is not None:
            _remove(tmp)
        return False


def _remove(path: str) -> bool:
    try:
        os.remove(path)
        return True
    except OSError:
        return False


def _touch(path: str) -> None:
    """Mark an entry used (eviction drops the least recently used first)."""
    try:
        os.utime(path)
    except OSError:
        pass


def _warn_once(kind: str, path: str, msg: str, *args) -> None:
    if (kind, path) in _WARNED:
        return
    _WARNED.add((kind, path))
    LOG.warning(msg, *args)
