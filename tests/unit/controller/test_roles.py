"""Canary and control as the fleet runs: the control is the target's engine container unchanged
(its own speculation kept), the canary and a promotion the fleet plus the candidate, and a
candidate that would replace a different method the fleet runs is refused with a condition naming
that method unless ``spec.lookahead.replaceExisting`` is true."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone
from pathlib import Path

import yaml

from lookahead_operator import engines
from lookahead_operator.api.policy import LookaheadPolicy
from lookahead_operator.api.status import ConditionType, LookaheadPolicyStatus, Phase
from lookahead_operator.controller import builders as b
from lookahead_operator.controller import observe
from lookahead_operator.controller import statemachine as sm
from lookahead_operator.controller.roles import candidate_transform, role_transform
from lookahead_operator.controller.world import Observed, Target

REPO = Path(__file__).resolve().parents[3]
EAGLE3 = '{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":3}'
NGRAM_CFG = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def policy(**lookahead):
    body = yaml.safe_load((REPO / "examples" / "chat-fleet.yaml").read_text())
    body["spec"]["engine"] = "vllm"
    body["spec"]["lookahead"] = {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMin": 2,
                                 "promptLookupMax": 5, **lookahead}
    body["metadata"].setdefault("namespace", "inference")
    return body, LookaheadPolicy.from_body(body).spec


def fleet(args=("--model", "meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", "64",
                "--speculative-config", EAGLE3)) -> dict:
    engine = {"name": "vllm", "image": "vllm/vllm-openai:v0.33.0", "command": ["vllm", "serve"], "args": list(args),
              "ports": [{"name": "http", "containerPort": 8000}]}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "llama", "namespace": "serving", "uid": "u1", "resourceVersion": "7",
                         "generation": 1, "labels": {"app": "llama"}},
            "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "llama"}},
                     "template": {"metadata": {"labels": {"app": "llama"}},
                                  "spec": {"containers": [{"name": "proxy", "image": "envoyproxy/envoy:v1.30"},
                                                          engine]}}}}


def engine_of(template: dict) -> dict:
    return next(c for c in template["spec"]["containers"] if c["name"] == "vllm")


def speculative_config(container: dict) -> dict:
    args = container["args"]
    return json.loads(args[args.index("--speculative-config") + 1])


def test_the_control_is_the_fleet_unchanged_and_keeps_eagle3():
    body, spec = policy(replaceExisting=True)
    d = fleet()
    control = b.build_role_deployment(d, body, "control", 1, role_transform(spec, "control", "vllm"),
                                      engines.is_engine_container)
    assert engine_of(control["spec"]["template"]) == engine_of(d["spec"]["template"])
    assert speculative_config(engine_of(control["spec"]["template"])) == json.loads(EAGLE3)
    assert engines.existing_method(engine_of(control["spec"]["template"]), "vllm").method == "eagle3"


def test_the_canary_with_replace_existing_runs_ngram_alone():
    body, spec = policy(replaceExisting=True)
    canary = b.build_role_deployment(fleet(), body, "canary", 1, role_transform(spec, "canary", "vllm"),
                                     engines.is_engine_container)
    assert speculative_config(engine_of(canary["spec"]["template"])) == NGRAM_CFG   # nothing of EAGLE-3 left


def test_the_canary_on_a_fleet_of_the_same_method_keeps_its_other_settings():
    _, spec = policy()
    d = fleet(args=("m", "--speculative-config",
                    '{"method":"ngram","num_speculative_tokens":2,"disable_padded_drafter_batch":true}'))
    canary = role_transform(spec, "canary", "vllm")(engine_of(d["spec"]["template"]))
    assert speculative_config(canary) == {**NGRAM_CFG, "disable_padded_drafter_batch": True}


def test_the_promoted_template_is_the_canarys_with_the_regime_and_restore_puts_the_saved_one_back():
    _, spec = policy(replaceExisting=True)
    d = fleet()
    d["metadata"]["annotations"] = b.claim_patch(d, "inference/chat-fleet")["metadata"]["annotations"]
    saved = copy.deepcopy(d["spec"]["template"])
    promoted = b.promote_body(d, candidate_transform(spec, "vllm", 8), engines.is_engine_container, "d1")
    canary = role_transform(spec, "canary", "vllm")(engine_of(saved))
    got = engine_of(promoted["spec"]["template"])
    assert {k: v for k, v in speculative_config(got).items() if k != "num_speculative_tokens_per_batch_size"} \
        == speculative_config(canary)
    assert speculative_config(got)["num_speculative_tokens_per_batch_size"] == [[1, 8, 4], [9, 64, 0]]
    promoted["metadata"]["annotations"] = {**d["metadata"]["annotations"], **promoted["metadata"]["annotations"]}
    assert b.restore_body(promoted)["spec"]["template"] == saved          # EAGLE-3 back, exactly


class _OneDeployment:
    """What ``observe._support_problems`` reads: one Deployment by key, and its pods (none ready
    here: the version is the policy's spec.lookahead.engineVersion)."""

    def __init__(self, d: dict):
        self.d = d

    def get_deployment(self, namespace: str, name: str) -> dict | None:
        return self.d if (namespace, name) == ("serving", "llama") else None

    def pods(self, namespace: str, selector: dict | None) -> list[dict]:
        return []


def _world(spec, problems=()):
    return Observed(now=T0, name="chat-fleet", namespace="inference", generation=1, spec=spec,
                    status=LookaheadPolicyStatus(), fingerprint=spec.fingerprint(),
                    targets=[Target("serving", "llama", "vllm")], support_problems=list(problems))


def test_a_candidate_that_would_replace_eagle3_is_refused_with_a_condition_naming_it():
    _, spec = policy(engineVersion="0.33.0")
    problems = observe._support_problems(_OneDeployment(fleet()), spec, _world(spec), Phase.Pending)
    assert len(problems) == 1
    assert problems[0].startswith("the fleet runs EAGLE-3 (vllm --speculative-config method eagle3); the candidate "
                                  "ngram would replace it: set spec.lookahead.replaceExisting: true to compare them")
    plan = sm.reconcile(_world(spec, problems))
    accepted = next(c for c in plan.status.conditions if c.type == ConditionType.Accepted)
    assert plan.status.phase == Phase.Failed and accepted.status == "False"
    assert "spec.lookahead.replaceExisting" in accepted.message and "EAGLE-3" in accepted.message
    assert plan.actions == []                                   # nothing created, the fleet untouched
    _, allowed = policy(replaceExisting=True, engineVersion="0.33.0")
    assert observe._support_problems(_OneDeployment(fleet()), allowed, _world(allowed), Phase.Pending) == []


def test_a_tensorrt_llm_fleet_is_refused_by_name_with_engine_auto():
    body, _ = policy()
    body["spec"]["engine"] = "auto"
    spec = LookaheadPolicy.from_body(body).spec
    d = fleet()
    d["spec"]["template"]["spec"]["containers"][1] = {
        "name": "trt", "image": "nvcr.io/nvidia/tensorrt-llm/release:1.2.1",
        "command": ["trtllm-serve", "serve", "Qwen/Qwen3-8B", "--port", "8000"]}
    target = observe.target_of(d, spec.engine)
    assert target.engine is None                                  # not detected as any supported engine
    w = Observed(now=T0, name="chat-fleet", namespace="inference", generation=1, spec=spec,
                 status=LookaheadPolicyStatus(), fingerprint=spec.fingerprint(), targets=[target])
    problems = observe._support_problems(_OneDeployment(d), spec, w, Phase.Pending)
    assert len(problems) == 1 and problems[0].startswith("TensorRT-LLM is not supported yet: ")
    plan = sm.reconcile(Observed(**{**w.__dict__, "support_problems": problems}))
    accepted = next(c for c in plan.status.conditions if c.type == ConditionType.Accepted)
    assert plan.status.phase == Phase.Failed and "TensorRT-LLM is not supported yet" in accepted.message
