"""The TensorRT-LLM adapter (``trtllm-serve``), configured by a YAML file (``--extra_llm_api_options``
/ ``--config``). :func:`trtllm_role_config` returns the ConfigMap body and the container edit;
``speculative_config: {decoding_type: NGram, max_draft_len, max_matching_ngram_size}`` and, for
regime-aware, ``max_concurrency``. The control's options equal the canary's but for speculation.
The command-line renderers refuse (the operator must create a ConfigMap). What each version
supports: ``docs/engines.md``.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Mapping

from lookahead_operator.api.metric_names import TRTLLM_METRICS
from lookahead_operator.engines.argv import container_argv, edit_container, flag_value, remove_flag
from lookahead_operator.engines.base import (Detection, EngineAdapter, EngineError, EngineSetup, Launcher,
    LookaheadParams, lookahead_params, pod_spec, regime_max_batch)
from lookahead_operator.engines.versions import engine_version, format_version

NAME = "trtllm"
LAUNCHER = Launcher(executable="trtllm-serve", subcommand="serve")
_LAUNCHERS = (LAUNCHER,)

TRTLLM_MIN_CHECKED = (1, 0, 0)
TRTLLM_MAX_CONCURRENCY_CHECKED = (1, 2, 0)
TRTLLM_OPTIONS_FLAG = "--extra_llm_api_options"       # every trtllm-serve; newer ones also take --config
TRTLLM_OPTIONS_FLAGS = ("--extra_llm_api_options", "--config")
TRTLLM_MOUNT_DIR = "/etc/lookahead-rollout/trtllm"
TRTLLM_OPTIONS_KEY = "extra-llm-api-options.yaml"
TRTLLM_VOLUME = "lookahead-trtllm-options"
_ROLES = ("canary", "control", "promote")


def trtllm_options_path(container: Mapping) -> str | None:
    """The options file a trtllm-serve container already passes (``--config`` /
    ``--extra_llm_api_options``), or ``None``."""
    argv = container_argv(container, _LAUNCHERS)
    for f in TRTLLM_OPTIONS_FLAGS:
        v = flag_value(argv, f)
        if v is not None:
            return v
    return None


def trtllm_options_source(pod_template: Mapping, container: Mapping) -> tuple[str, str] | None:
    """``(configmap name, key)`` holding the container's existing options file when it is mounted
    from a ConfigMap (so the operator can read it and pass it as ``base_options``)."""
    path = trtllm_options_path(container)
    if not path:
        return None
    volumes = {v.get("name"): v for v in pod_spec(pod_template).get("volumes") or []}
    for m in container.get("volumeMounts") or []:
        mp = str(m.get("mountPath") or "").rstrip("/")
        vol = volumes.get(m.get("name")) or {}
        cm = vol.get("configMap")
        if not cm or not mp:
            continue
        if m.get("subPath") and path == mp:
            return cm["name"], m["subPath"]
        if path.startswith(mp + "/"):
            return cm["name"], path[len(mp) + 1:]
    return None


def _regime_problems(setup: EngineSetup, backend: str) -> list[str]:
    if setup.lookahead.method == "jacobi":
        return ["TensorRT-LLM's max_concurrency (speculation off above a batch size) is PyTorch-backend "
                "only, so a Lookahead regime cannot be enforced; use promotion mode full or analysisOnly"]
    if backend not in ("pytorch",):
        return [f"TensorRT-LLM's max_concurrency is PyTorch-backend only (here --backend {backend})"]
    if not setup.version.at_least(TRTLLM_MAX_CONCURRENCY_CHECKED):
        return [f"{setup.version.describe()}: speculative_config.max_concurrency was checked only from TensorRT-LLM "
                f"{format_version(TRTLLM_MAX_CONCURRENCY_CHECKED)}; use promotion mode full or analysisOnly, or set "
                f"spec.lookahead.engineVersion if the image is newer"]
    return []


def _config_problems(setup: EngineSetup, regime_aware: bool) -> list[str]:
    """What this version and backend cannot do for the lookahead (and a regime)."""
    out: list[str] = []
    p, ver = setup.lookahead, setup.version
    backend = (flag_value(setup.argv, "--backend") or "pytorch").lower()
    if ver.version is not None and ver.version < TRTLLM_MIN_CHECKED:
        out.append(f"{ver.describe()} predates the TensorRT-LLM releases this operator was checked against "
                   f"({format_version(TRTLLM_MIN_CHECKED)}+; trtllm-serve options differ)")
    if p.method in ("ngram_gpu", "suffix"):
        out.append(f"TensorRT-LLM has no {p.method!r} method; use ngram (NGram) or jacobi (Lookahead)")
    if p.method == "jacobi" and backend not in ("tensorrt", "trt"):
        out.append("TensorRT-LLM's Lookahead decoding (W, N, G) runs on its TensorRT backend only "
                   f"(this container uses --backend {backend}); use method ngram, or --backend tensorrt")
    if regime_aware:
        out += _regime_problems(setup, backend)
    return out


def problems(setup: EngineSetup, regime_aware: bool) -> list[str]:
    """:func:`_config_problems`, and an options file the operator cannot carry into the roles."""
    out = _config_problems(setup, regime_aware)
    path = trtllm_options_path(setup.container)
    if path and setup.pod_template is not None and trtllm_options_source(setup.pod_template, setup.container) is None:
        out.append(f"container {setup.container.get('name') or '?'!r} passes its own trtllm-serve options file "
                   f"{path}, not mounted from a ConfigMap, so the operator cannot carry it into the canary "
                   f"and control")
    return out


def trtllm_speculative_config(lookahead_spec: Any, regime: Any = None) -> dict:
    """The ``speculative_config`` section of trtllm-serve's options for a lookahead spec."""
    p = lookahead_params(lookahead_spec)
    max_batch = regime_max_batch(regime)
    if p.method == "jacobi":
        cfg: dict[str, Any] = {"decoding_type": "Lookahead", "max_window_size": p.window,
                               "max_ngram_size": p.ngram, "max_verification_set_size": p.guess_set}
    elif p.method == "ngram":
        cfg = {"decoding_type": "NGram", "max_draft_len": p.num_speculative_tokens,
               "max_matching_ngram_size": p.prompt_lookup_max}
    else:
        raise EngineError(f"TensorRT-LLM has no {p.method!r} method; use ngram (NGram) or jacobi (Lookahead)")
    if max_batch is not None:
        cfg["max_concurrency"] = max_batch
    return cfg


def _yaml_dump(data: Mapping) -> str:
    import yaml  # pyyaml: a dependency of kopf and of the operator

    return yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False)


def _base_options(base_options: Mapping | str | None) -> dict:
    if base_options is None:
        return {}
    if isinstance(base_options, str):
        import yaml

        data = yaml.safe_load(base_options) or {}
        if not isinstance(data, Mapping):
            raise EngineError("the fleet's trtllm-serve options file is not a YAML mapping")
        return dict(data)
    return copy.deepcopy(dict(base_options))


@dataclass(frozen=True)
class TrtllmRoleConfig:
    """What one role (canary or control) of a trtllm-serve fleet needs: a ConfigMap with the
    options YAML, the pod volume that mounts it, and the edited container."""
    options: dict
    config_map: dict
    volume: dict
    container: dict

    def apply_to_pod_spec(self, pod_spec: Mapping, container_name: str | None = None) -> dict:
        """A NEW pod spec with the container replaced and the volume added (replaced by name)."""
        spec = copy.deepcopy(dict(pod_spec))
        name = container_name or self.container.get("name")
        spec["containers"] = [self.container if c.get("name") == name else c for c in spec.get("containers") or []]
        vols = [v for v in spec.get("volumes") or [] if v.get("name") != self.volume["name"]]
        spec["volumes"] = vols + [self.volume]
        return spec


def _role_options(container: Mapping, p: LookaheadParams, role: str, regime: Any,
                  base_options: Mapping | str | None) -> dict:
    """The role's options: the fleet's own, with our ``speculative_config`` (none for the control)."""
    setup = EngineSetup(container, None, p, engine_version(container, NAME, p), container_argv(container, _LAUNCHERS))
    existing = trtllm_options_path(container)
    if existing and base_options is None:
        raise EngineError(f"container {container.get('name') or '?'!r} passes its own trtllm-serve options file "
                          f"{existing}; the operator cannot read files inside the image: mount it from a ConfigMap "
                          f"(then its content is passed on) or drop the flag")
    if role != "control":
        refused = _config_problems(setup, regime is not None)
        if refused:
            raise EngineError("; ".join(refused))
    options = _base_options(base_options)
    options.pop("speculative_config", None)
    if role != "control":
        options["speculative_config"] = trtllm_speculative_config(p, regime)
    return options


def _mount_options(container: Mapping) -> dict:
    """The container passing the mounted options file (and no other) and mounting its volume."""
    path = f"{TRTLLM_MOUNT_DIR}/{TRTLLM_OPTIONS_KEY}"

    def fn(argv: list[str]) -> list[str]:
        for f in TRTLLM_OPTIONS_FLAGS:
            argv = remove_flag(argv, f)
        return argv + [TRTLLM_OPTIONS_FLAG, path]

    c = edit_container(container, fn, _LAUNCHERS)
    mounts = [m for m in c.get("volumeMounts") or [] if m.get("name") != TRTLLM_VOLUME]
    c["volumeMounts"] = mounts + [{"name": TRTLLM_VOLUME, "mountPath": TRTLLM_MOUNT_DIR, "readOnly": True}]
    return c


def trtllm_role_config(container: Mapping, lookahead_spec: Any, role: str, *, config_map_name: str,
                       namespace: str | None = None, regime: Any = None,
                       base_options: Mapping | str | None = None,
                       labels: Mapping[str, str] | None = None) -> TrtllmRoleConfig:
    """The ConfigMap body and container edit for a trtllm-serve ``role`` ("canary": speculation
    on, "control": off, "promote": on with ``regime``). ``base_options``: the fleet's own options
    (YAML text or a mapping) when the container already passes ``--config`` /
    ``--extra_llm_api_options`` (see :func:`trtllm_options_source`); both roles start from the
    same base, so the control's options equal the canary's but for ``speculative_config``."""
    if role not in _ROLES:
        raise EngineError(f"unknown role {role!r} (expected canary, control or promote)")
    options = _role_options(container, lookahead_params(lookahead_spec), role, regime, base_options)
    cm_meta: dict[str, Any] = {"name": config_map_name}
    if namespace:
        cm_meta["namespace"] = namespace
    if labels:
        cm_meta["labels"] = dict(labels)
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": cm_meta,
                  "data": {TRTLLM_OPTIONS_KEY: _yaml_dump(options)}}
    volume = {"name": TRTLLM_VOLUME, "configMap": {"name": config_map_name}}
    return TrtllmRoleConfig(options=options, config_map=config_map, volume=volume, container=_mount_options(container))


def render_lookahead(container: Mapping, lookahead_spec: Any, regime: Any = None) -> dict:
    raise EngineError("TensorRT-LLM takes its speculative options from a YAML file: the operator must create a "
                      "ConfigMap for it; use engines.trtllm_role_config(container, spec, role, config_map_name=...)")


def render_off(container: Mapping) -> dict:
    raise EngineError("TensorRT-LLM takes its speculative options from a YAML file: the operator must create a "
                      "ConfigMap for it; use engines.trtllm_role_config(container, spec, 'control', "
                      "config_map_name=...)")


def regime_config(p: LookaheadParams, max_batch_size: int, engine_max_batch: int | None) -> dict:
    """The ``speculative_config`` a regime-aware promotion writes into the options file."""
    return {"speculative_config": trtllm_speculative_config(p, max_batch_size)}


ADAPTER = EngineAdapter(NAME, Detection(re.compile(r"trtllm-serve|tensorrt[-_]llm"), order=1, launcher=LAUNCHER),
                        checked_version="1.2.1", metrics=TRTLLM_METRICS, problems=problems, render_on=render_lookahead,
                        render_off=render_off, regime_config=regime_config, edits_command_line=False)
