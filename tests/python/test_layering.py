"""The components include only downward (docs/architecture.md, "Layers").

CMakeLists.txt states the layers once: each `linac_component(NAME DIRS ... [HEADERS ...] [DEPENDS ...])`
names the folders and public headers it owns and the components right below it. Headers are included
root-relative ("compiler/ir/ir.h"), so every component can name every header: the include paths cannot
forbid an upward include, this test does. It reads those calls, then every `#include "..."` of every
.cpp and .h a component owns, and fails naming file:line where a component includes a file of a
component that is not below it (or a file no component owns). Needs no build.
"""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PUBLIC_INCLUDE = "dsl/include"  # where "linac/..." includes resolve
_CALL = re.compile(r"^\s*linac_component\(([^)]*)\)", re.MULTILINE)
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


class Component:
    def __init__(self, name, dirs, headers, depends):
        self.name, self.dirs, self.headers, self.depends = name, dirs, headers, depends


def parse_components(cmake_text):
    """The linac_component calls of a CMakeLists text, in order (comments stripped)."""
    text = "\n".join(line.split("#", 1)[0] for line in cmake_text.splitlines())
    components = {}
    for call in _CALL.finditer(text):
        words = call.group(1).split()
        name, lists, key = words[0], {"DIRS": [], "HEADERS": [], "DEPENDS": []}, None
        for w in words[1:]:
            if w in lists:
                key = w
            elif key is None:
                raise ValueError(f"linac_component({name}): '{w}' before DIRS, HEADERS or DEPENDS")
            else:
                lists[key].append(w)
        components[name] = Component(name, lists["DIRS"], lists["HEADERS"], lists["DEPENDS"])
    return components


def below(components):
    """Per component, every component under it (DEPENDS, transitively). ValueError on an unknown name or
    a cycle."""
    out = {}

    def visit(name, path):
        if name in path:
            raise ValueError(f"components depend on each other in a cycle: {' -> '.join(path + [name])}")
        if name not in components:
            raise ValueError(f"{path[-1]} DEPENDS on {name}, which is no linac_component")
        if name not in out:
            reach = set()
            for dep in components[name].depends:
                reach |= {dep} | visit(dep, path + [name])
            out[name] = reach
        return out[name]

    for name in components:
        visit(name, [])
    return out


def owner(path, components):
    """The component that owns a repository-relative path (its longest DIRS prefix, or its HEADERS)."""
    best, best_len = None, -1
    for c in components.values():
        if path in c.headers:
            return c.name
        for d in c.dirs:
            if path.startswith(d.rstrip("/") + "/") and len(d) > best_len:
                best, best_len = c.name, len(d)
    return best


def owned_files(root, components):
    files = []
    for c in components.values():
        for d in c.dirs:
            files += [p for p in sorted((root / d).rglob("*")) if p.suffix in (".cpp", ".h")]
        files += [root / h for h in c.headers]
    return files


def check_layering(root):
    """(violations, includes checked): one message per upward or unowned #include under `root`."""
    components = parse_components((root / "CMakeLists.txt").read_text())
    lower = below(components)
    violations, checked = [], 0
    for f in owned_files(root, components):
        rel = f.relative_to(root).as_posix()
        me = owner(rel, components)
        for lineno, line in enumerate(f.read_text().splitlines(), 1):
            m = _INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            path = f"{PUBLIC_INCLUDE}/{target}" if target.startswith("linac/") else target
            if not (root / path).is_file():
                path = (f.parent / target).relative_to(root).as_posix()  # a file beside the includer
            checked += 1
            other = owner(path, components)
            if other is None:
                violations.append(f"{rel}:{lineno}: {me} includes \"{target}\", which no linac_component owns")
            elif other != me and other not in lower[me]:
                violations.append(f"{rel}:{lineno}: {me} includes \"{target}\" of {other}, which is not below it "
                                  f"(CMakeLists.txt: {me} DEPENDS {' '.join(components[me].depends) or 'nothing'})")
    # Every public header belongs to a component (else its includes would go unchecked).
    for h in sorted((root / PUBLIC_INCLUDE).rglob("*.h")):
        rel = h.relative_to(root).as_posix()
        if owner(rel, components) is None:
            violations.append(f"{rel}: a public header no linac_component lists in HEADERS")
    return violations, checked


def test_every_include_points_down():
    violations, checked = check_layering(REPO)
    assert not violations, "includes that point up the layers:\n" + "\n".join(violations)
    assert checked > 300, f"only {checked} includes checked: is CMakeLists.txt's linac_component list read?"


def test_the_layers_are_the_documented_order():
    lower = below(parse_components((REPO / "CMakeLists.txt").read_text()))
    assert lower["linac_base"] == set()
    assert "linac_dsl" not in lower["linac_nvptx"] | lower["linac_passes"] | lower["linac_interp"]
    assert "linac_runtime" not in lower["linac_kernels"]
    assert {"linac_kernels", "linac_nvptx", "linac_dsl", "linac_base"} <= lower["linac_runtime"]


def _tree(tmp_path, files):
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


CMAKE = """# a comment with linac_component(linac_fake DIRS nowhere)
linac_component(linac_low DIRS low HEADERS dsl/include/linac/low.h)
linac_component(linac_high DIRS high
                DEPENDS linac_low)  # trailing comment
"""


def test_the_checker_accepts_downward_includes(tmp_path):
    root = _tree(tmp_path, {"CMakeLists.txt": CMAKE, "dsl/include/linac/low.h": "",
                            "low/a.h": '#include "linac/low.h"\n', "low/a.cpp": '#include "a.h"\n',
                            "high/b.cpp": '#include "low/a.h"\n#include <vector>\n// #include "high/none.h"\n'})
    assert check_layering(root) == ([], 3)


def test_the_checker_names_an_upward_include(tmp_path):
    root = _tree(tmp_path, {"CMakeLists.txt": CMAKE, "dsl/include/linac/low.h": "", "high/b.h": "",
                            "low/a.cpp": '#include "linac/low.h"\n  #  include "high/b.h"\n'})
    violations, _ = check_layering(root)
    assert len(violations) == 1 and violations[0].startswith('low/a.cpp:2: linac_low includes "high/b.h" of linac_high')


def test_the_checker_names_unowned_files_and_headers(tmp_path):
    root = _tree(tmp_path, {"CMakeLists.txt": CMAKE, "dsl/include/linac/low.h": "", "dsl/include/linac/stray.h": "",
                            "tools/t.h": "", "low/a.cpp": '#include "tools/t.h"\n'})
    violations, _ = check_layering(root)
    assert violations == ['low/a.cpp:1: linac_low includes "tools/t.h", which no linac_component owns',
                          "dsl/include/linac/stray.h: a public header no linac_component lists in HEADERS"]


def test_the_checker_refuses_a_cycle(tmp_path):
    cycle = CMAKE.replace("linac_component(linac_low DIRS low", "linac_component(linac_low DIRS low DEPENDS linac_high")
    try:
        below(parse_components(cycle))
    except ValueError as e:
        assert "cycle" in str(e)
    else:
        raise AssertionError("a cycle of DEPENDS was accepted")
