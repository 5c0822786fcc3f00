"""Serving flags wired to validate, without a daemon: the cache here is a file the test writes from a
static read of the 0.6.3-style parser fixture (tests/fixtures/vllm-0.6.3-parser/, baseline cli_args included),
stored under the key ``validate`` computes for the manifest; ``invoke validate`` then runs as a user runs it.
The caches learnt from real images (introspection of the cpu base, the static read of the bi100 fixture after
its baseline) are tested in tests/integration/test_flagcheck_images.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from imageforge.errors import ConfigError
from imageforge.flags.check import serving_args_of_resolved
from imageforge.flags.images import (
    NOT_CHECKED,
    changes_parser,
    check_resolved,
    flag_method,
    flags_key,
    index_key,
    parser_steps,
    store_flags,
    table_from_json,
    table_to_json,
)
from imageforge.flags.learn import read_static
from imageforge.flags.model import FlagSpec, FlagTable
from imageforge.manifest import yamldoc
from imageforge.manifest.load import load_manifest
from imageforge.manifest.resolve import Resolved, resolve
from imageforge.patches import check as checkpatches

REPO = Path(__file__).resolve().parents[2]
INVOKE = REPO / ".venv" / "bin" / "invoke"
PARSER = REPO / "tests" / "fixtures" / "vllm-0.6.3-parser"

MANIFEST = """\
version: 1
default_target: vendor
targets:
  vendor:
    base:
      image: imageforge-test/flags-vendor:1
    package:
      import: vllm
      distribution: vllm
      version: "0.6.3"
      flags: static
    run:
      port: 8000
    serving:
      config_path: /workspace/run.yaml
      args:
        model: /model
        served-model-name: llm
{args}    default_profile: small
    profiles:
      small:
        args:
{profile}"""


def fixture_table() -> FlagTable:
    sources = {
        "vllm/engine/arg_utils.py": (PARSER / "vendor" / "vllm" / "engine" / "arg_utils.py").read_text(),
        "vllm/entrypoints/openai/cli_args.py": (PARSER / "baseline" / "cli_args.py").read_text(),
    }
    return read_static(sources, label="the 0.6.3 parser fixture")


def write(tmp_path: Path, args: str = "", profile: str = "          max-num-seqs: 4\n") -> Path:
    path = tmp_path / "build.yaml"
    path.write_text(MANIFEST.format(args=args, profile=profile))
    return path


def fill_cache(manifest: Path, cache: Path) -> None:
    try:
        target = load_manifest(manifest).targets["vendor"]
    except ConfigError:
        return  # the schema refuses it already (underscores): validate says so before any flag check
    env = {"IMAGEFORGE_CACHE": str(cache)}
    table = fixture_table()
    store_flags(table, key="sha256:" + "0" * 64, base_id="sha256:" + "1" * 64, method="static",
                index=index_key(target, env), environ=env)


def validate(manifest: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "IMAGEFORGE_CACHE": str(cache)}
    env.pop("IMAGEFORGE_TRACEBACK", None)
    return subprocess.run([str(INVOKE), "validate", "--manifest", str(manifest)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


# The mistakes: (serving args lines, profile lines, the line's text, key path, message, a detail).
MISTAKES = [
    ("        max-num-seq: 8\n", None, "max-num-seq: 8", "targets.vendor.serving.args.max-num-seq",
     "unknown serving flag 'max-num-seq'", "did you mean 'max-num-seqs'"),
    ("        max_num_seqs: 8\n", None, "max_num_seqs: 8", "targets.vendor.serving.args.max_num_seqs",
     "key 'max_num_seqs' has the wrong form", "use dashes: 'max-num-seqs'"),  # the schema's key pattern
    ("        max-num-seqs: many\n", None, "max-num-seqs: many", "targets.vendor.serving.args.max-num-seqs",
     "max-num-seqs takes an integer", "found:    string 'many'"),
    ("        gpu-memory-utilization: 1.5\n", None, "gpu-memory-utilization: 1.5",
     "targets.vendor.serving.args.gpu-memory-utilization", "gpu-memory-utilization is out of range", "> 0 and <= 1"),
    ("", '          max-num-seqs: "8"\n', 'max-num-seqs: "8"', "targets.vendor.profiles.small.args.max-num-seqs",
     "max-num-seqs takes an integer", "write it without quotes: 8"),
]


@pytest.mark.parametrize(("args", "profile", "line_text", "key_path", "message", "detail"), MISTAKES,
                         ids=["typo", "underscores", "many", "fraction", "profile-string"])
def test_validate_names_the_key_and_its_line(tmp_path: Path, args: str, profile: str | None, line_text: str,
                                             key_path: str, message: str, detail: str) -> None:
    manifest = write(tmp_path, args, profile) if profile else write(tmp_path, args)
    fill_cache(manifest, tmp_path / "cache")
    proc = validate(manifest, tmp_path / "cache")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out
    line = line_of(manifest, line_text)
    assert f"{manifest}:{line}:" in out, out
    assert key_path in out and message in out and detail in out, out


def test_validate_passes_a_right_manifest_and_says_what_it_checked(tmp_path: Path) -> None:
    manifest = write(tmp_path, "        max-num-seqs: 8\n        reasoning-parser: qwen3\n")
    fill_cache(manifest, tmp_path / "cache")
    proc = validate(manifest, tmp_path / "cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "target vendor: serving flags checked against the 0.6.3 parser fixture (cached)" in proc.stdout


def test_validate_without_a_cache_says_the_flags_were_not_checked(tmp_path: Path) -> None:
    manifest = write(tmp_path, "        max-num-seq: 8\n")
    proc = validate(manifest, tmp_path / "empty-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "target vendor: flags not checked: run plan or check-patches once with the daemon" in proc.stdout
    assert NOT_CHECKED == "flags not checked: run plan or check-patches once with the daemon"


def test_another_base_reference_does_not_use_the_cache(tmp_path: Path) -> None:
    manifest = write(tmp_path, "        max-num-seq: 8\n")
    fill_cache(manifest, tmp_path / "cache")
    manifest.write_text(manifest.read_text().replace("flags-vendor:1", "flags-vendor:2"))
    proc = validate(manifest, tmp_path / "cache")
    assert proc.returncode == 0 and "target vendor: flags not checked" in proc.stdout, proc.stdout + proc.stderr


def test_a_port_conflict_points_at_the_serving_port(tmp_path: Path) -> None:
    manifest = write(tmp_path, "        port: 9000\n")
    fill_cache(manifest, tmp_path / "cache")
    proc = validate(manifest, tmp_path / "cache")
    assert proc.returncode == 2
    assert f"{manifest}:{line_of(manifest, 'port: 9000')}:" in proc.stderr
    assert "serving port differs from run.port" in proc.stderr


def test_the_parser_steps_of_the_repository_targets() -> None:
    manifest = load_manifest(REPO / "build.yaml")
    cpu, bi100 = manifest.targets["cpu"], manifest.targets["bi100"]
    # cpu: every step up to the ldconfig script (a script may change anything), not the platform patch after it;
    # bi100: the baseline replaces cli_args.py
    ids = [s.id for s in cpu.steps]
    assert ids[-2:] == ["ldconfig", "cpu-engine-start-method"]
    assert [s.id for s in parser_steps(cpu.steps)] == ids[:-1]
    assert [s.id for s in parser_steps(bi100.steps)] == ["organisers-baseline"]
    assert (flag_method(cpu), flag_method(bi100)) == ("introspect", "static")


def test_which_steps_change_the_parser(tmp_path: Path) -> None:
    steps = """\
    steps:
      - {id: a, kind: patch, file: vllm/engine/arg_utils.py, old: "x", new: "y"}
      - {id: b, kind: overlay, source: o.py, dest: vllm/entrypoints/openai/cli_args.py}
      - {id: c, kind: patch, file: vllm/attention/ops/prefix_prefill.py, old: "x", new: "y"}
      - {id: d, kind: overlay, source: o.py, dest: vllm/model_executor/x.py}
"""
    (tmp_path / "o.py").write_text("X = 1\n")
    path = write(tmp_path)
    path.write_text(path.read_text().replace("    run:\n", steps + "    run:\n"))
    target = load_manifest(path).targets["vendor"]
    assert [changes_parser(s) for s in target.steps] == [True, True, False, False]
    assert [s.id for s in parser_steps(target.steps)] == ["a", "b"]


def test_the_cache_file_round_trips_a_table() -> None:
    table = fixture_table()
    again = table_from_json(table_to_json(table))
    assert again == table
    dtype, tp = again.get("dtype"), again.get("tensor-parallel-size")
    assert dtype is not None and dtype.type == "choice" and "bfloat16" in dtype.choices
    assert tp is not None and tp.aliases == ("-tp",)


def test_the_static_reader_resolves_choices_named_by_a_module_constant() -> None:
    from imageforge.flags.learn import flags_from_source

    source = ('PARSERS = ["hermes", "qwen3_coder"]\n'
              'parser.add_argument("--tool-call-parser", type=str, choices=PARSERS)\n')
    (spec,) = flags_from_source(source, "cli_args.py")
    assert (spec.name, spec.type, spec.choices, spec.origin) == ("tool-call-parser", "choice",
                                                                 ("hermes", "qwen3_coder"), "cli_args.py:2")


@pytest.mark.parametrize("written", ["off", '"off"'])
def test_flags_off_unquoted_or_quoted_turns_the_check_off(tmp_path: Path, written: str) -> None:
    manifest = write(tmp_path, "        max-num-seq: 8\n")
    manifest.write_text(manifest.read_text().replace("flags: static", f"flags: {written}"))
    assert flag_method(load_manifest(manifest).targets["vendor"]) == "off"
    proc = validate(manifest, tmp_path / "cache")
    assert proc.returncode == 0 and "flags not checked" not in proc.stdout, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- the no-op path


def _accept_all(resolved: Resolved) -> FlagTable:
    """A table that accepts every flag the resolved target writes (the check itself is tested above)."""
    names = {arg.key for arg in serving_args_of_resolved(resolved)} | {"model", "port", "served-model-name"}
    return FlagTable({n: FlagSpec(n, "any", multiple=True, nullable=True) for n in names}, "a permissive table")


def test_a_flag_cache_hit_opens_no_session_and_parses_no_yaml_with_the_position_loader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The no-op build's manifest and flag check: read with libyaml, never the position-tracking Python loader
    (it re-reads a file only to report a problem in it)."""
    env = {"IMAGEFORGE_CACHE": str(tmp_path / "cache")}
    positional: list[str] = []
    original = yamldoc._Loader.__init__

    def counting(self: yamldoc._Loader, stream: str) -> None:
        positional.append(stream[:40])
        original(self, stream)

    def no_daemon(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a flag-cache hit asked for an image session")

    monkeypatch.setattr(yamldoc._Loader, "__init__", counting)
    monkeypatch.setattr(checkpatches, "image_session", no_daemon)
    manifest = load_manifest(REPO / "build.yaml")
    assert positional == []
    resolved = resolve(manifest, "cpu", None, environ=env)
    target = resolved.target
    base_id = "sha256:" + "1" * 64
    store_flags(_accept_all(resolved), key=flags_key(base_id, target.steps, env), base_id=base_id,
                method=flag_method(target), index=index_key(target, env), environ=env)
    assert check_resolved(resolved, env) is None  # checked: no "flags not checked" note
    assert check_resolved(resolved, env) is None  # the suite's models now come from their content cache
    assert list((tmp_path / "cache" / "flags" / "suites").glob("*.json"))
    assert positional == []
    broken = tmp_path / "broken.yaml"
    broken.write_text("version: 1\ntargets: [\n")
    with pytest.raises(ConfigError):
        load_manifest(broken)
    assert len(positional) == 1  # a file with a problem: the position loader says where


@pytest.mark.parametrize("name", ["build.yaml", "smoke/dummy.yaml", "smoke/real-weights.yaml", "images/cpu/base.yaml"])
def test_libyaml_reads_the_same_document_as_the_position_loader(name: str) -> None:
    slow, fast = yamldoc.load_yaml(REPO / name), yamldoc.load_yaml_c(REPO / name)
    assert (fast.data, fast.positions, fast.scalars, fast.raw) == (slow.data, slow.positions, slow.scalars, slow.raw)


def test_the_flag_index_is_keyed_by_content_so_a_fresh_clone_finds_it(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    for part in ("build.yaml", "images", "overlays", "smoke"):
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, clone / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            clone.mkdir(exist_ok=True)
            shutil.copy2(src, clone / part)
    env = {"IMAGEFORGE_CACHE": str(tmp_path / "cache")}
    here = load_manifest(REPO / "build.yaml").targets["cpu"]
    there = load_manifest(clone / "build.yaml").targets["cpu"]
    assert here.base.recipe != there.base.recipe
    assert index_key(here, env) == index_key(there, env)
    (clone / "images" / "cpu" / "install.sh").write_text("# another recipe\n")
    assert index_key(here, env) != index_key(load_manifest(clone / "build.yaml").targets["cpu"], env)


def test_every_command_that_resolves_refuses_what_validate_refuses(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`many` in the target's args, the selected profile overriding the key: validate refused it,
    plan and build accepted it. Every command resolving a target now says validate's message (exit 2)."""
    from imageforge import app

    manifest = write(tmp_path, "        max-num-seqs: many\n")
    fill_cache(manifest, tmp_path / "cache")
    want = validate(manifest, tmp_path / "cache")
    assert want.returncode == 2 and "max-num-seqs takes an integer" in want.stdout + want.stderr
    env = {**os.environ, "IMAGEFORGE_CACHE": str(tmp_path / "cache")}
    env.pop("IMAGEFORGE_TRACEBACK", None)
    plan = subprocess.run([str(INVOKE), "plan", "--manifest", str(manifest), "--target", "vendor", "--profile",
                           "small", "--no-daemon"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert plan.returncode == 2, plan.stdout + plan.stderr
    first = next(line for line in (want.stdout + want.stderr).splitlines() if "max-num-seqs" in line)
    assert first in plan.stdout + plan.stderr
    monkeypatch.setenv("IMAGEFORGE_CACHE", str(tmp_path / "cache"))
    s = app.settings(manifest=str(manifest))
    calls: dict[str, Callable[[], object]] = {
        "build": lambda: app.build(s, "vendor", "small", [], verbose=False, quiet=True),
        "check-patches": lambda: app.check_patches(s, "vendor", "small", diff=False, show=print),
        "export": lambda: app.export(s, "vendor", "small", out=str(tmp_path / "x.tar"), push=None, gzip_=False,
                                     save=False, quiet=True),
        "submission": lambda: app.submission(s, "vendor", "small", [], out=str(tmp_path / "tree")),
    }
    for name, call in calls.items():
        with pytest.raises(ConfigError) as caught:
            call()
        assert caught.value.exit_code == 2, name
        assert "max-num-seqs takes an integer" in caught.value.render(), name


def test_the_flags_key_follows_the_parser_not_the_layer_chain(tmp_path: Path) -> None:
    """An edit of a patch to a module that is not a parser file keeps the flags (no new introspection)."""
    for part in ("build.yaml", "images", "overlays", "smoke"):
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, tmp_path / part)
    env: dict[str, str] = {}
    text = (tmp_path / "build.yaml").read_text()

    def keys(manifest_text: str) -> tuple[str, str | None]:
        (tmp_path / "build.yaml").write_text(manifest_text)
        target = load_manifest(tmp_path / "build.yaml").targets["cpu"]
        return flags_key("sha256:" + "1" * 64, target.steps, env), index_key(target, env)

    before = keys(text)
    edited = text.replace("BASE_BLOCK = 64  # imageforge", "BASE_BLOCK = 32  # imageforge", 1)
    assert edited != text
    assert keys(edited) == before  # prefix_prefill.py is no parser file
    script = tmp_path / "overlays" / "cpu" / "scripts" / "ldconfig.sh"
    script.write_text(script.read_text() + "\n# changed\n")
    assert keys(text) != before  # a script may change anything
