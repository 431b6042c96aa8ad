"""The DGD renderer (``--output dgd``, reference §7.7): exact manifests for agg round_robin, agg
kv_router with the Planner on, and disagg candidates (built by ``unroll_sample``), the multinode
split, the files of scalar and Pareto outputs, and every rejection."""

from __future__ import annotations

import json

import pytest
import yaml

from aisim.search.spica import SearchSpace, unroll_sample
from aisim.search.spica.config import Dgd
from aisim.search.spica.dgd import DEFAULT_RUNTIME_VERSION, manifest_yaml, render_manifest, write_dgd
from aisim.simulator.errors import InputError, NotSupportedError

MODEL = "Qwen/Qwen3-32B-FP8"
BASE = {"model_name": MODEL, "hardware_sku": "h200_sxm"}
IMAGE = f"nvcr.io/nvidia/ai-dynamo/vllm-runtime:{DEFAULT_RUNTIME_VERSION}"
WORKDIR = "/workspace/examples/backends/vllm"
VLLM = ["python3", "-m", "dynamo.vllm"]
ONE = {"tp": 1, "pp": 1, "attention_dp": 1, "moe_tp": 1, "moe_ep": 1, "replicas": 1}
AGG_SHAPE = {**ONE, "tp": 2, "replicas": 3}
DISAGG_SHAPE = {"prefill": {**ONE, "tp": 4, "moe_ep": 4, "replicas": 2},
                "decode": {**ONE, "attention_dp": 8, "moe_ep": 8, "replicas": 1}}
AGG_SELECTION = {
    "deployment_mode": "agg", "backend": "vllm", "agg_max_num_batched_tokens": 16384, "agg_max_num_seqs": 512,
    "router_mode": "kv_router", "overlap_score_credit": 0.5, "prefill_load_scale": 2.0, "router_temperature": 0.2,
    "planner_scaling_policy": "hybrid_180_5", "planner_fpm_sampling": "large", "planner_load_sensitivity": "aggressive"}
DISAGG_SELECTION = {
    "deployment_mode": "disagg", "backend": "vllm", "prefill_max_num_batched_tokens": 8192, "prefill_max_num_seqs": 4,
    "decode_max_num_batched_tokens": 8192, "decode_max_num_seqs": 1024, "router_mode": "kv_router",
    "overlap_score_credit": 1.0, "prefill_load_scale": 0.0, "router_temperature": 0.0,
    "planner_scaling_policy": "load_180_10", "planner_fpm_sampling": "small", "planner_load_sensitivity": "default"}
PROPHET_180 = {"best_by_interval": {"180": {"load_predictor": "prophet", "load_predictor_log1p": True,
                                            "prophet_window_size": 20}}}
DIRECT = {"name": "llama-spica", "renderer": "direct"}


def _flat(selection, shape, predictor=None, **space):
    return unroll_sample(SearchSpace.from_dict({**BASE, **space}), selection, shape, predictor)


def _agg_round_robin(**space):
    return _flat({**AGG_SELECTION, "router_mode": "round_robin", "planner_scaling_policy": "disabled"}, AGG_SHAPE,
                 **space)


def _disagg(**space):
    return _flat(DISAGG_SELECTION, DISAGG_SHAPE, context_length=32768, min_endpoint=1, min_gpu_budget=4, **space)


def _frontend(name, args, image=IMAGE, **extra):
    return {"dynamoNamespace": name, "componentType": "frontend", "replicas": 1, **extra,
            "extraPodSpec": {"mainContainer": {"image": image, "command": ["python3", "-m", "dynamo.frontend"],
                                               "args": args}}}


def _worker_container(args, image=IMAGE):
    return {"mainContainer": {"image": image, "workingDir": WORKDIR, "command": VLLM, "args": args}}


# -- manifests ---------------------------------------------------------------------------------
def test_agg_round_robin_candidate():
    config = _agg_round_robin(context_length=8192)
    before = dict(config)
    manifest = render_manifest(config, Dgd(name="llama-spica", namespace="inference", renderer="direct"))
    assert config == before  # not modified
    assert manifest == {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "llama-spica", "namespace": "inference"},
        "spec": {"services": {
            "Frontend": _frontend("llama-spica", ["--router-mode", "round-robin"]),
            "VllmDecodeWorker": {
                "dynamoNamespace": "llama-spica", "componentType": "worker", "replicas": 3,
                "resources": {"limits": {"gpu": "2"}},
                "extraPodSpec": _worker_container([
                    "--model", MODEL, "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1",
                    "--max-num-batched-tokens", "16384", "--max-num-seqs", "512", "--block-size", "64",
                    "--gpu-memory-utilization", "0.9", "--enable-prefix-caching", "--max-model-len", "8192"]),
            },
        }},
    }
    text = manifest_yaml(manifest)
    assert text.startswith("apiVersion: nvidia.com/v1alpha1\nkind: DynamoGraphDeployment\nmetadata:\n"
                           "  name: llama-spica\n  namespace: inference\nspec:\n  services:\n    Frontend:\n")
    assert yaml.safe_load(text) == manifest
    assert "gpu: '2'" in text  # Kubernetes quantities and args stay strings


def test_agg_kv_router_candidate_with_the_planner_on():
    config = _flat(AGG_SELECTION, AGG_SHAPE, PROPHET_180, min_endpoint=1, min_gpu_budget=4)
    dgd = {**DIRECT, "runtime_image": "registry.example/dynamo:custom", "runtime_version_override": "1.4.2"}
    manifest = render_manifest(config, dgd, planner_target="sla", sla={"ttft_ms": 500.0, "itl_ms": 50.0})
    head = {"dynamoNamespace": "llama-spica"}
    image = "registry.example/dynamo:custom"
    planner_json = (
        '{"environment":"kubernetes","backend":"vllm","mode":"agg","optimization_target":"sla","ttft_ms":500.0,'
        '"itl_ms":50.0,"enable_throughput_scaling":true,"enable_load_scaling":true,'
        '"throughput_adjustment_interval_seconds":180,"load_adjustment_interval_seconds":5,'
        '"max_num_fpm_samples":128,"fpm_sample_bucket_size":16,"load_scaling_down_sensitivity":70,'
        '"load_min_observations":3,"load_predictor":"prophet","load_predictor_log1p":true,"prophet_window_size":20,'
        '"max_gpu_budget":32,"min_gpu_budget":4,"min_endpoint":1,"model_name":"Qwen/Qwen3-32B-FP8",'
        '"decode_engine_num_gpu":2}')
    assert manifest == {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "llama-spica"},
        "spec": {"services": {
            "Frontend": {
                **head, "componentType": "frontend", "replicas": 1, "runtimeVersionOverride": "1.4.2",
                "extraPodSpec": {"mainContainer": {
                    "image": image, "command": ["python3", "-m", "dynamo.frontend"],
                    "args": ["--router-mode", "kv", "--router-kv-overlap-score-credit", "0.5",
                             "--router-prefill-load-scale", "2.0", "--router-temperature", "0.2"]}},
            },
            "VllmDecodeWorker": {
                **head, "componentType": "worker", "replicas": 3, "runtimeVersionOverride": "1.4.2",
                "resources": {"limits": {"gpu": "2"}},
                "extraPodSpec": _worker_container([
                    "--model", MODEL, "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1",
                    "--max-num-batched-tokens", "16384", "--max-num-seqs", "512", "--block-size", "64",
                    "--gpu-memory-utilization", "0.9", "--enable-prefix-caching"], image),
            },
            "Planner": {
                **head, "componentType": "planner", "replicas": 1, "runtimeVersionOverride": "1.4.2",
                "extraPodSpec": {"mainContainer": {
                    "image": image, "command": ["python3", "-m", "dynamo.planner"],
                    "args": ["--config", planner_json]}},
            },
        }},
    }
    # without an explicit target a throughput-scaling Planner runs under sla (no SLA values to pass)
    implied = json.loads(render_manifest(config, DIRECT)["spec"]["services"]["Planner"]["extraPodSpec"]
                         ["mainContainer"]["args"][1])
    assert implied["optimization_target"] == "sla" and "ttft_ms" not in implied


def test_disagg_candidate_prefill_and_decode_workers():
    manifest = render_manifest(_disagg(), {"name": "spica", "renderer": "direct"})
    services = manifest["spec"]["services"]
    assert list(services) == ["Frontend", "VllmPrefillWorker", "VllmDecodeWorker", "Planner"]
    assert services["Frontend"] == _frontend("spica", [
        "--router-mode", "kv", "--router-kv-overlap-score-credit", "1.0", "--router-prefill-load-scale", "0.0",
        "--router-temperature", "0.0"])
    assert services["VllmPrefillWorker"] == {
        "dynamoNamespace": "spica", "componentType": "worker", "subComponentType": "prefill", "replicas": 2,
        "resources": {"limits": {"gpu": "4"}},
        "extraPodSpec": _worker_container([
            "--model", MODEL, "--tensor-parallel-size", "4", "--pipeline-parallel-size", "1",
            "--enable-expert-parallel", "--max-num-batched-tokens", "8192", "--max-num-seqs", "4",
            "--block-size", "64", "--gpu-memory-utilization", "0.9", "--enable-prefix-caching",
            "--max-model-len", "32768", "--is-prefill-worker"]),
    }
    assert services["VllmDecodeWorker"] == {
        "dynamoNamespace": "spica", "componentType": "worker", "subComponentType": "decode", "replicas": 1,
        "resources": {"limits": {"gpu": "8"}},
        "extraPodSpec": _worker_container([
            "--model", MODEL, "--tensor-parallel-size", "1", "--pipeline-parallel-size", "1",
            "--data-parallel-size", "8", "--enable-expert-parallel", "--max-num-batched-tokens", "8192",
            "--max-num-seqs", "1024", "--block-size", "64", "--gpu-memory-utilization", "0.9",
            "--no-enable-prefix-caching", "--max-model-len", "32768", "--is-decode-worker"]),
    }
    planner = services["Planner"]
    assert planner["componentType"] == "planner" and planner["replicas"] == 1
    # a load-only Planner with no target given leaves optimization_target to Dynamo's default
    assert json.loads(planner["extraPodSpec"]["mainContainer"]["args"][1]) == {
        "environment": "kubernetes", "backend": "vllm", "mode": "disagg", "enable_throughput_scaling": False,
        "enable_load_scaling": True, "throughput_adjustment_interval_seconds": 180,
        "load_adjustment_interval_seconds": 10, "max_num_fpm_samples": 32, "fpm_sample_bucket_size": 4,
        "load_scaling_down_sensitivity": 80, "load_min_observations": 5, "max_gpu_budget": 32,
        "min_gpu_budget": 4, "min_endpoint": 1, "model_name": MODEL, "prefill_engine_num_gpu": 4,
        "decode_engine_num_gpu": 8}


def test_the_host_tier_goes_to_prefill_workers_only_and_the_frontend_weighs_it():
    selection = {**DISAGG_SELECTION, "host_cache_hit_weight": 1.0, "disk_cache_hit_weight": 0.5}
    config = _flat(selection, DISAGG_SHAPE, context_length=32768, num_g2_blocks=4096, bandwidth_g1_to_g2_gbps=20.0)
    services = render_manifest(config, DIRECT)["spec"]["services"]
    prefill, decode = services["VllmPrefillWorker"], services["VllmDecodeWorker"]
    assert prefill["envs"] == [{"name": "DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS", "value": "4096"}]
    assert prefill["extraPodSpec"]["mainContainer"]["args"][-2:] == ["--connector", "kvbm"]
    assert "envs" not in decode and "kvbm" not in decode["extraPodSpec"]["mainContainer"]["args"]
    assert services["Frontend"]["extraPodSpec"]["mainContainer"]["args"][-4:] == [
        "--router-host-cache-hit-weight", "1.0", "--router-disk-cache-hit-weight", "0.5"]
    # an aggregated candidate's workers carry it too
    agg = _flat({**AGG_SELECTION, "host_cache_hit_weight": 0.75, "disk_cache_hit_weight": 0.25}, AGG_SHAPE,
                num_g2_blocks=4096)
    worker = render_manifest(agg, DIRECT)["spec"]["services"]["VllmDecodeWorker"]
    assert worker["envs"][0]["value"] == "4096"
    assert worker["extraPodSpec"]["mainContainer"]["args"][-2:] == ["--connector", "kvbm"]


def test_a_worker_larger_than_a_node_splits_over_nodes():
    manifest = render_manifest(_disagg(), {"name": "spica", "renderer": "direct", "num_gpus_per_node": 4})
    prefill, decode = (manifest["spec"]["services"][k] for k in ("VllmPrefillWorker", "VllmDecodeWorker"))
    assert "multinode" not in prefill and prefill["resources"] == {"limits": {"gpu": "4"}}  # fits one node
    assert decode["multinode"] == {"nodeCount": 2}
    assert decode["resources"] == {"limits": {"gpu": "4"}}  # per node
    assert list(decode)[:6] == ["dynamoNamespace", "componentType", "subComponentType", "replicas", "multinode",
                                "resources"]
    args = decode["extraPodSpec"]["mainContainer"]["args"]
    assert args[args.index("--data-parallel-size") + 1] == "8"  # the worker keeps its whole size
    # the Planner still counts the engine's GPUs, not one pod's
    planner = json.loads(manifest["spec"]["services"]["Planner"]["extraPodSpec"]["mainContainer"]["args"][1])
    assert planner["decode_engine_num_gpu"] == 8
    with pytest.raises(InputError) as err:
        render_manifest(_disagg(), {"name": "spica", "renderer": "direct", "num_gpus_per_node": 3})
    assert err.value.where == "dgd.num_gpus_per_node" and "do not split evenly over 3 nodes" in err.value.message


# -- files -------------------------------------------------------------------------------------
def _record(n, config, score, status="feasible", prediction=None):
    return {"candidate_id": f"candidate-{n:06d}", "status": status, "config": config,
            "prediction_config": prediction, "score": score}


def test_scalar_target_writes_the_first_feasible_candidate(tmp_path):
    winner, other = _agg_round_robin(), _disagg()
    candidates = [_record(4, other, None, status="infeasible"), _record(2, winner, 120.0), _record(1, other, 90.0)]
    paths = write_dgd(tmp_path, candidates, DIRECT, "throughput", [])
    assert paths == [tmp_path / "dgd.yaml"]
    assert (tmp_path / "dgd.yaml").read_text() == manifest_yaml(render_manifest(winner, DIRECT))
    # output_file elsewhere; no feasible candidate writes nothing
    assert write_dgd(tmp_path, candidates, {**DIRECT, "output_file": "deploy/llama.yaml"}, "goodput", []) == [
        tmp_path / "deploy" / "llama.yaml"]
    assert write_dgd(tmp_path / "none", candidates[:1], DIRECT, "throughput", []) == []
    assert not (tmp_path / "none").exists()


def test_scalar_target_kustomize_directory(tmp_path):
    candidates = [_record(2, _agg_round_robin(), 120.0)]
    paths = write_dgd(tmp_path, candidates, {**DIRECT, "output_dir": "k8s"}, "throughput", [])
    assert paths == [tmp_path / "k8s" / "llama-spica.yaml", tmp_path / "k8s" / "kustomization.yaml"]
    assert (tmp_path / "k8s" / "kustomization.yaml").read_text() == (
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- llama-spica.yaml\n")


def test_the_planner_target_and_sla_come_from_the_prediction_config(tmp_path):
    config = _flat({**AGG_SELECTION, "planner_scaling_policy": "load_180_5"}, AGG_SHAPE)
    prediction = {"planner": {"policy": "enabled", "target": "latency"},
                  "evaluation": {"sla": {"ttft_ms": 500.0, "itl_ms": 50.0}}}
    write_dgd(tmp_path, [_record(0, config, 1.0, prediction=prediction)], DIRECT, "ttft", [])
    manifest = yaml.safe_load((tmp_path / "dgd.yaml").read_text())
    planner = json.loads(manifest["spec"]["services"]["Planner"]["extraPodSpec"]["mainContainer"]["args"][1])
    assert planner["optimization_target"] == "latency" and "ttft_ms" not in planner  # SLA values only under sla


def test_pareto_renders_every_front_member_and_an_index(tmp_path):
    a, b = _agg_round_robin(), _disagg()
    candidates = [_record(1, a, [10.0, 3.0]), _record(3, b, [8.0, 5.0]), _record(5, a, None, status="failed")]
    dgd = {"name": "spica-{index}", "namespace": "inference", "renderer": "direct"}
    paths = write_dgd(tmp_path, candidates, dgd, "pareto", ["candidate-000003", "candidate-000001"])
    assert paths == [tmp_path / "dgd-000.yaml", tmp_path / "dgd-001.yaml", tmp_path / "index.json"]
    first, second = (yaml.safe_load(p.read_text()) for p in paths[:2])
    assert first == render_manifest(b, dgd, 0) and second == render_manifest(a, dgd, 1)
    assert first["metadata"] == {"name": "spica-000", "namespace": "inference"}
    assert second["metadata"] == {"name": "spica-001", "namespace": "inference"}
    assert first["spec"]["services"]["Frontend"]["dynamoNamespace"] == "spica-000"
    assert (tmp_path / "index.json").read_text() == json.dumps({
        "000": {"candidate_id": "candidate-000003", "file": "dgd-000.yaml", "name": "spica-000", "score": [8.0, 5.0]},
        "001": {"candidate_id": "candidate-000001", "file": "dgd-001.yaml", "name": "spica-001", "score": [10.0, 3.0]},
    }, indent=2, sort_keys=True) + "\n"


def test_pareto_in_a_kustomize_directory(tmp_path):
    candidates = [_record(1, _agg_round_robin(), [10.0, 3.0]), _record(3, _disagg(), [8.0, 5.0])]
    dgd = {"name": "spica-{index}", "renderer": "direct", "output_dir": "front"}
    paths = write_dgd(tmp_path, candidates, dgd, "pareto", ["candidate-000001", "candidate-000003"])
    front = tmp_path / "front"
    assert paths == [front / "spica-000.yaml", front / "spica-001.yaml", front / "kustomization.yaml",
                     front / "index.json"]
    assert yaml.safe_load((front / "kustomization.yaml").read_text())["resources"] == ["spica-000.yaml",
                                                                                       "spica-001.yaml"]
    index = json.loads((front / "index.json").read_text())
    assert [index[k]["file"] for k in ("000", "001")] == ["spica-000.yaml", "spica-001.yaml"]
    with pytest.raises(InputError) as err:
        write_dgd(tmp_path, candidates, dgd, "pareto", ["candidate-000009"])
    assert err.value.where == "pareto_ids"


# -- rejections --------------------------------------------------------------------------------
def test_renderer_aic_is_not_supported(tmp_path):
    assert Dgd(name="llama-spica").renderer == "direct"  # our default: aic's generator is not available here
    for dgd in ({"name": "llama-spica", "renderer": "aic"}, Dgd(name="llama-spica", renderer="aic")):
        with pytest.raises(NotSupportedError) as err:
            render_manifest(_agg_round_robin(), dgd)
        assert err.value.where == "dgd.renderer" and err.value.category == "unsupported"
        assert "use renderer: direct" in err.value.message
        with pytest.raises(NotSupportedError):
            write_dgd(tmp_path, [_record(0, _agg_round_robin(), 1.0)], dgd, "throughput", [])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("change", "where", "error", "message"), [
    ({"backend": "tgi"}, "backend", NotSupportedError, "vllm, sglang and trtllm candidates render"),
    ({"num_g2_blocks": 64, "backend": "sglang"}, "num_g2_blocks", NotSupportedError, "vllm workers only"),
    ({"host_cache_hit_weight": 0.75}, "host_cache_hit_weight", NotSupportedError, "num_g2_blocks > 0"),
    ({"aic_nextn": 1, "backend": "sglang"}, "aic_nextn", NotSupportedError, "MTP on SGLang workers"),
    ({"moe_ep": 4}, "moe_ep", NotSupportedError, "tp x data-parallel ranks (2)"),
    ({"moe_tp": 4}, "moe_tp", NotSupportedError, "not expressible"),
    ({"router_mode": "random"}, "router_mode", InputError, "round_robin or kv_router"),
    ({"deployment_mode": "mixed"}, "deployment_mode", InputError, "agg or disagg"),
])
def test_configs_that_cannot_render(change, where, error, message):
    with pytest.raises(error) as err:
        render_manifest({**_agg_round_robin(), **change}, DIRECT)
    assert err.value.where == where and message in err.value.message


def test_missing_keys_and_bad_dgd_settings():
    config = _agg_round_robin()
    del config["agg_max_num_seqs"]
    with pytest.raises(InputError, match="agg_max_num_seqs: is missing"):
        render_manifest(config, DIRECT)
    with pytest.raises(InputError) as err:
        render_manifest(_agg_round_robin(), {"name": "spica-{index}", "renderer": "direct"})
    assert err.value.where == "dgd.name"
    with pytest.raises(InputError) as err:
        render_manifest(_agg_round_robin(), {**DIRECT, "runtime_version_override": "1.5"})
    assert err.value.where == "dgd.runtime_version_override"
    with pytest.raises(InputError) as err:
        render_manifest(_agg_round_robin(), {**DIRECT, "renderr": "direct"})
    assert err.value.where == "dgd.renderr"
    throughput = _flat(AGG_SELECTION, AGG_SHAPE)
    with pytest.raises(InputError) as err:
        render_manifest(throughput, DIRECT, planner_target="throughput")
    assert err.value.where == "enable_throughput_scaling"


def test_write_dgd_checks_the_index_placeholder_against_the_target(tmp_path):
    candidates = [_record(0, _agg_round_robin(), 1.0)]
    with pytest.raises(InputError, match="put {index} in the name"):
        write_dgd(tmp_path, candidates, DIRECT, "pareto", ["candidate-000000"])
    with pytest.raises(InputError, match="remove {index}"):
        write_dgd(tmp_path, candidates, {"name": "spica-{index}", "renderer": "direct"}, "throughput", [])



# -- TensorRT-LLM workers ----------------------------------------------------------------------
TRT_IMAGE = f"nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:{DEFAULT_RUNTIME_VERSION}"


def _engine_args(args):
    """The worker's --override-engine-args JSON, parsed."""
    return json.loads(args[args.index("--override-engine-args") + 1])


def test_a_trtllm_aggregated_candidate_renders_trtllm_workers():
    config = _flat({**AGG_SELECTION, "backend": "trtllm", "router_mode": "round_robin",
                    "planner_scaling_policy": "disabled"}, AGG_SHAPE, context_length=8192, backend=["trtllm"])
    manifest = render_manifest(config, Dgd(**DIRECT))
    services = manifest["spec"]["services"]
    assert list(services) == ["Frontend", "TRTLLMWorker"]
    assert services["Frontend"]["extraPodSpec"]["mainContainer"]["image"] == TRT_IMAGE
    worker = services["TRTLLMWorker"]
    assert (worker["replicas"], worker["resources"], "subComponentType" in worker) == (3, {"limits": {"gpu": "2"}}, False)
    c = worker["extraPodSpec"]["mainContainer"]
    assert (c["image"], c["workingDir"], c["command"]) == (TRT_IMAGE, "/workspace/", ["python3", "-m", "dynamo.trtllm"])
    args = c["args"]
    assert args[: args.index("--override-engine-args")] == [
        "--model-path", MODEL, "--served-model-name", MODEL, "--tensor-parallel-size", "2",
        "--pipeline-parallel-size", "1", "--expert-parallel-size", "1", "--no-enable-attention-dp",
        "--max-num-tokens", "16384", "--max-batch-size", "512", "--kv-block-size", "64",
        "--free-gpu-memory-fraction", "0.9", "--max-seq-len", "8192"]
    assert _engine_args(args) == {
        "kv_cache_config": {"tokens_per_block": 64, "enable_block_reuse": True, "free_gpu_memory_fraction": 0.9},
        "enable_chunked_prefill": True, "trust_remote_code": True, "cuda_graph_config": {"max_batch_size": 512}}


def test_a_trtllm_disaggregated_candidate_renders_prefill_and_decode_workers():
    config = _flat({**DISAGG_SELECTION, "backend": "trtllm"},
                   {"prefill": {**ONE, "tp": 4, "moe_ep": 4, "replicas": 2},
                    "decode": {**ONE, "attention_dp": 8, "moe_ep": 8, "replicas": 1}},
                   context_length=32768, min_endpoint=1, min_gpu_budget=4, backend=["trtllm"])
    services = render_manifest(config, Dgd(**DIRECT))["spec"]["services"]
    assert [k for k in services if k not in ("Frontend", "Planner")] == ["prefill", "decode"]
    pre, dec = services["prefill"], services["decode"]
    assert (pre["subComponentType"], dec["subComponentType"]) == ("prefill", "decode")
    pargs = pre["extraPodSpec"]["mainContainer"]["args"]
    dargs = dec["extraPodSpec"]["mainContainer"]["args"]
    assert pargs[pargs.index("--disaggregation-mode") + 1] == "prefill"
    assert "--publish-events-and-metrics" in pargs and "--publish-events-and-metrics" not in dargs  # kv_router
    # decode: attention DP 8 over tp 1 is TRT-LLM's tensor-parallel size 8 with attention DP on
    assert dargs[dargs.index("--tensor-parallel-size") + 1] == "8" and "--enable-attention-dp" in dargs
    assert dargs[dargs.index("--expert-parallel-size") + 1] == "8"
    assert _engine_args(pargs)["cache_transceiver_config"] == {"backend": "DEFAULT"}
    assert (_engine_args(pargs)["disable_overlap_scheduler"], _engine_args(dargs)["disable_overlap_scheduler"]) == (
        True, False)
    planner = json.loads(services["Planner"]["extraPodSpec"]["mainContainer"]["args"][1])
    assert planner["backend"] == "trtllm"


SGL_IMAGE = "nvcr.io/nvidia/ai-dynamo/sglang-runtime:1.5.0"


def test_an_sglang_aggregated_candidate_renders_sglang_workers():
    config = _flat({**AGG_SELECTION, "backend": "sglang", "router_mode": "round_robin",
                    "planner_scaling_policy": "disabled"}, AGG_SHAPE, context_length=8192, backend=["sglang"])
    services = render_manifest(config, Dgd(**DIRECT))["spec"]["services"]
    assert list(services) == ["Frontend", "decode"]  # (SGLang's aggregated worker is named decode)
    worker = services["decode"]
    assert (worker["replicas"], worker["resources"], "subComponentType" in worker) == (3, {"limits": {"gpu": "2"}}, False)
    c = worker["extraPodSpec"]["mainContainer"]
    assert (c["image"], c["workingDir"], c["command"]) == (
        SGL_IMAGE, "/workspace/examples/backends/sglang", ["python3", "-m", "dynamo.sglang"])
    # the prefill budgets the replay simulated (SGLang's own; it does not read max_num_batched_tokens)
    assert c["args"] == [
        "--model-path", MODEL, "--served-model-name", MODEL, "--tp-size", "2", "--pp-size", "1",
        "--page-size", "64", "--mem-fraction-static", "0.9", "--max-running-requests", "512",
        "--chunked-prefill-size", "8192", "--max-prefill-tokens", "16384", "--context-length", "8192",
        "--trust-remote-code", "--skip-tokenizer-init"]


def test_sglang_disaggregated_workers_take_their_role_and_dp_totals():
    config = _flat({**DISAGG_SELECTION, "backend": "sglang"},
                   {"prefill": {**ONE, "tp": 4, "moe_ep": 4, "replicas": 2},
                    "decode": {**ONE, "attention_dp": 8, "moe_ep": 8, "replicas": 1}},
                   context_length=32768, min_endpoint=1, min_gpu_budget=4, backend=["sglang"])
    services = render_manifest(config, Dgd(**DIRECT))["spec"]["services"]
    pargs = services["prefill"]["extraPodSpec"]["mainContainer"]["args"]
    dargs = services["decode"]["extraPodSpec"]["mainContainer"]["args"]
    assert pargs[pargs.index("--disaggregation-mode") + 1] == "prefill" and "--kv-events-config" in pargs
    assert "--kv-events-config" not in dargs
    # DP attention 8 over tp 1: SGLang's tp size is the worker's 8 GPUs; per-rank limits x 8
    assert dargs[dargs.index("--tp-size") + 1] == "8" and dargs[dargs.index("--dp-size") + 1] == "8"
    assert "--enable-dp-attention" in dargs and dargs[dargs.index("--ep-size") + 1] == "8"
    seqs = config["decode_max_num_seqs"]
    assert dargs[dargs.index("--max-running-requests") + 1] == str(seqs * 8)


def test_a_trtllm_shape_it_cannot_express_is_refused():
    config = _flat({**AGG_SELECTION, "backend": "trtllm", "router_mode": "round_robin",
                    "planner_scaling_policy": "disabled"}, {**ONE, "tp": 2, "attention_dp": 2}, backend=["trtllm"])
    with pytest.raises(NotSupportedError) as info:
        render_manifest(config, Dgd(**DIRECT))
    assert info.value.where == "agg_attention_dp" or info.value.where == "attention_dp"


def test_mtp_renders_as_each_backends_speculative_config():
    import json

    def worker_args(manifest, service):
        return manifest["spec"]["services"][service]["extraPodSpec"]["mainContainer"]["args"]

    vllm = render_manifest({**_agg_round_robin(), "aic_nextn": 2}, DIRECT)
    args = worker_args(vllm, next(k for k in vllm["spec"]["services"] if k != "Frontend"))
    i = args.index("--speculative-config")
    assert json.loads(args[i + 1]) == {"method": "mtp", "num_speculative_tokens": 2}
    trt = render_manifest({**_agg_round_robin(), "aic_nextn": 1, "backend": "trtllm"}, DIRECT)
    args = worker_args(trt, next(k for k in trt["spec"]["services"] if k != "Frontend"))
    engine = json.loads(args[args.index("--override-engine-args") + 1])
    assert engine["speculative_config"] == {"decoding_type": "MTP", "num_nextn_predict_layers": 1}
    plain = render_manifest(_agg_round_robin(), DIRECT)
    assert "--speculative-config" not in worker_args(plain, next(k for k in plain["spec"]["services"]
                                                                 if k != "Frontend"))
