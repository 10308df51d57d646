"""The house rules of protoflask/ (docs/ARCHITECTURE.md), checked on the source itself.

(a) every import runs downward: a module imports, at any level (module, function,
    TYPE_CHECKING), only from its own layer or below; protoflask.client imports the core
    only, and only the command line imports the client;
(b) no module imports a private name (``_name``) of another module, nor a private module
    of another package;
(c) no file is longer than MAX_LINES;
(d) importing protoflask.core and protoflask.client loads neither Flask nor gevent;
(e) the transports and the adapters (agui/, mcp/: every module) import nothing of the
    session layer (layers 2 and 3) but ``port``, nor read the port's ``live`` or
    ``engine`` (or an engine's ``hub``) to reach past it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from .support import ROOT

PACKAGE = Path(ROOT) / "protoflask"
MAX_LINES = 500

#: The layers, bottom to top (docs/ARCHITECTURE.md). A name stands for the module and,
#: for a package, everything in it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),
    ("config", "options", "auth", "jwks", "signals", "tools", "tool_runner", "logs", "origins",
     "tickets", "clock", "fastschema", "streaming", "stats", "limits", "pins", "turns", "bell",
     "ids"),
    ("hub", "live", "cluster"),
    ("engine", "port", "adapter_ports", "dispatch", "kept", "budget", "ticker", "wheel"),
    ("transports",),
    ("web", "post_lane", "dashboard", "operator_actions", "metrics", "vitals", "blueprints",
     "mcp", "agui"),
    # "": the package itself (its lazy public names); __main__: python -m protoflask
    ("server", "serving", "gunicorn_worker", "head_lane", "lane_response", "cli", "wsgi",
     "__main__", ""),
)
#: The client sits beside the core's users: it imports the core only.
CLIENT = "client"
CLIENT_MAY_IMPORT = {"core", CLIENT}
CLIENT_IMPORTED_BY = {"cli", CLIENT}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _top(module: str) -> str:
    """The layer table's name for a module: protoflask.cluster.hub -> cluster."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer(module: str) -> int | None:
    top = _top(module)
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    return None


def _imports(module: str, path: Path) -> list[tuple[int, str, str | None]]:
    """(line, imported module, imported name or None) for every import statement."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rsplit(".", 1)[0]
    out: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out += [(node.lineno, target, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, alias.name, None) for alias in node.names]
    return out


def _resolve(target: str, name: str | None) -> str | None:
    """The protoflask module an import reaches (a submodule when the name is one)."""
    for candidate in ([f"{target}.{name}"] if name else []) + [target]:
        while candidate:
            if candidate in MODULES:
                return candidate
            candidate = candidate.rsplit(".", 1)[0] if "." in candidate else ""
    return None


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def test_every_import_runs_downward():
    wrong = []
    for module, path in sorted(MODULES.items()):
        rank, top = _layer(module), _top(module)
        for line, target, name in _imports(module, path):
            reached = _resolve(target, name)
            if reached is None or reached == module:
                continue
            where = f"{path.relative_to(ROOT)}:{line} {module} -> {reached}"
            reached_top = _top(reached)
            if top == CLIENT:
                if reached_top not in CLIENT_MAY_IMPORT:
                    wrong.append(f"{where} (the client imports the core only)")
                continue
            if reached_top == CLIENT:
                if top not in CLIENT_IMPORTED_BY:
                    wrong.append(f"{where} (only the command line uses the client)")
                continue
            reached_rank = _layer(reached)
            if rank is None or reached_rank is None:
                wrong.append(f"{where} (a module the layer table does not place)")
            elif reached_rank > rank:
                wrong.append(f"{where} (layer {rank} imports layer {reached_rank})")
    assert not wrong, "imports that run upward:\n" + "\n".join(wrong)


def test_no_module_imports_a_private_name_of_another():
    wrong = []
    for module, path in sorted(MODULES.items()):
        for line, target, name in _imports(module, path):
            reached = _resolve(target, name)
            if reached is None:
                continue
            where = f"{path.relative_to(ROOT)}:{line} {module}"
            # a private module may be imported from inside its own package only
            parts = reached.split(".")
            for depth, part in enumerate(parts):
                owner = ".".join(parts[:depth])
                if _private(part) and module != owner and not module.startswith(owner + "."):
                    wrong.append(f"{where} imports the private module {reached}")
                    break
            if name is not None and _private(name) and reached != f"{target}.{name}":
                wrong.append(f"{where} imports the private name {name} of {reached}")
    assert not wrong, "private imports:\n" + "\n".join(sorted(set(wrong)))


def test_no_file_is_longer_than_the_limit():
    long = {str(path.relative_to(ROOT)): n for path in sorted(MODULES.values())
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


def test_the_core_and_the_client_load_neither_flask_nor_gevent():
    probe = ("import sys, json; import protoflask.core, protoflask.client; "
             "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout))
    assert not loaded & {"flask", "werkzeug", "gevent", "gunicorn"}


def test_the_layer_table_places_every_module():
    unplaced = sorted(m for m in MODULES if _top(m) != CLIENT and _layer(m) is None)
    assert not unplaced, f"modules the layer table does not place: {unplaced}"


#: What holds a ``port.SessionPort`` and nothing else of the session layer: the
#: transports, and the adapters (their admission through ``port.AdapterPorts``, their live
#: transports on the port), whole packages.
PORT_HOLDERS = ("protoflask.transports", "protoflask.agui", "protoflask.mcp")
#: The session layer (layers 2 and 3) and the one name of it a port holder may import.
SESSION_LAYER = set(LAYERS[2]) | set(LAYERS[3])
PORT = "port"


def test_port_holders_import_nothing_of_the_session_layer_but_the_port():
    wrong = []
    for module, path in sorted(MODULES.items()):
        if not any(module == h or module.startswith(h + ".") for h in PORT_HOLDERS):
            continue
        for line, target, name in _imports(module, path):
            reached = _resolve(target, name)
            if reached is None or _top(reached) not in SESSION_LAYER - {PORT}:
                continue
            wrong.append(f"{path.relative_to(ROOT)}:{line} {module} -> {reached}")
    assert not wrong, "port holders reaching past the port:\n" + "\n".join(wrong)


#: What a port holder would reach past its port through (``SessionPort.live`` and
#: ``.engine`` are the port's own; the engine's ``hub``): never read outside the port.
PAST_THE_PORT = {"live", "engine", "hub"}


def test_port_holders_do_not_reach_past_the_port_through_its_attributes():
    wrong = []
    for module, path in sorted(MODULES.items()):
        if not any(module == h or module.startswith(h + ".") for h in PORT_HOLDERS):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in PAST_THE_PORT:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert not wrong, "port holders reaching past the port:\n" + "\n".join(wrong)


def test_every_port_holder_exists():
    # a renamed module would leave the check above checking nothing
    for holder in PORT_HOLDERS:
        assert holder in MODULES, holder
