"""TRL (the real package, pinned to 1.16.0 in requirements.lock) trains with rmscore's reward functions.

A real GRPOTrainer trains a tiny policy for two steps on CPU, with rmscore's sync and async reward
functions after a pickle round-trip (as TRL's AsyncGRPOTrainer sends them to a worker), against a
real server that is stopped (SIGTERM) after the first step and started again on the same port.
The policy is built from a config with a fixed seed, as TRL's own tests build tiny models, and uses
the reward model's tokenizer from the model repository: nothing is downloaded.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading

import pytest
import torch
from datasets import Dataset
from transformers import (AutoModelForSequenceClassification, AutoTokenizer, LlamaConfig, LlamaForCausalLM,
                          TrainerCallback)
from trl import GRPOConfig, GRPOTrainer

import servers
from rmscore_client import RewardClient
from rmscore_client.adapters.trl import message_text, rmscore_async_reward, rmscore_reward
from test_client import FixedPortReplica, assert_scores, free_port, local_tokenizer, ort_scores

PROMPTS = ["Why is the sky blue?", "Name a prime number.", "Write a haiku about rain.", "What is 2 + 2?"]
# Each call may wait this long for a restarting server (the default is the client's 30 s; a cold
# start on a loaded 2-core runner can take longer).
CALL_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def replica():
    r = FixedPortReplica("py-grpc-onnxruntime")
    r.start()
    yield r
    r.stop()


def reference(prompts, completions) -> list[float]:
    """TRL 1.16's reward-model path for a string dataset (GRPOTrainer._calculate_rewards, nn.Module
    branch): prompt + completion as one text, tokenized without added special tokens."""
    return ort_scores([local_tokenizer().encode(p + c, add_special_tokens=False).ids
                       for p, c in zip(prompts, completions)])


def tiny_policy():
    tok = AutoTokenizer.from_pretrained(str(servers.MODEL / "hf"))
    tok.eos_token = tok.sep_token  # the BERT tokenizer has no EOS of its own; [SEP] ends a completion
    tok.padding_side = "left"
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=tok.vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    return LlamaForCausalLM(config), tok


class RestartAfterFirstStep(TrainerCallback):
    """SIGTERM the server once step 1 is done, then start it again on the same port, in the background:
    step 2's reward calls meet no server, then a warming one, and must wait it out."""

    def __init__(self, replica):
        self.replica, self.thread, self.old_pid = replica, None, None

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == 1 and self.thread is None:
            self.old_pid = self.replica.server.proc.pid
            self.replica.stop()
            self.thread = threading.Thread(target=self.replica.start, daemon=True)
            self.thread.start()


def test_grpo_trains_through_a_server_restart(replica, tmp_path):
    sync_f = pickle.loads(pickle.dumps(rmscore_reward(replica.target, name="rm_sync", timeout_s=CALL_TIMEOUT_S)))
    async_f = pickle.loads(pickle.dumps(rmscore_async_reward(replica.target, name="rm_async",
                                                             timeout_s=CALL_TIMEOUT_S)))
    model, tok = tiny_policy()
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=8, max_steps=2, logging_steps=1, learning_rate=1e-3, seed=0,
                      use_cpu=True, bf16=False, report_to="none", save_strategy="no", disable_tqdm=True)
    restart = RestartAfterFirstStep(replica)
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[sync_f, async_f], args=args,
                          train_dataset=Dataset.from_dict({"prompt": PROMPTS}), callbacks=[restart])
    try:
        trainer.train()
    finally:
        sync_f.close()
        if restart.thread is not None:
            restart.thread.join(300)
    assert trainer.state.global_step == 2
    assert replica.server.proc.pid != restart.old_pid, "the server was not restarted during training"
    # Step 2's calls met the stopped server and were re-sent until the new one answered.
    used = trainer.reward_funcs[0]
    assert max(t.attempts for t in used.last_result.timings) > 1
    # What TRL logged for the last generation batch is what the server scores for those texts.
    logs = trainer._logs
    prompts, completions = list(logs["prompt"]), list(logs["completion"])
    want = reference(prompts, completions)
    assert_scores(list(logs["rewards"]["rm_sync"]), want)
    assert_scores(list(logs["rewards"]["rm_async"]), want)


def test_string_dataset_scores_as_trls_own_reward_model_path(replica, tmp_path):
    """TRL itself scores the same batch twice: with the reward model as an nn.Module (its own path:
    prompt + completion as one text, no special tokens added, the model's logits) and with rmscore's
    reward functions. The columns agree; before, the adapter sent encode(prompt, completion), with
    [CLS]/[SEP] TRL never adds, so every reward differed. string_format="pair" keeps that encoding."""
    hf = str(servers.MODEL / "hf")
    rm = AutoModelForSequenceClassification.from_pretrained(hf).eval()
    rm_tok = AutoTokenizer.from_pretrained(hf)
    sync_f = rmscore_reward(replica.target, name="rm_sync", timeout_s=CALL_TIMEOUT_S)
    async_f = rmscore_async_reward(replica.target, name="rm_async", timeout_s=CALL_TIMEOUT_S)
    pair_f = rmscore_reward(replica.target, name="rm_pair", string_format="pair", timeout_s=CALL_TIMEOUT_S)
    model, tok = tiny_policy()
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=8, max_steps=1, logging_steps=1, learning_rate=1e-3, seed=0,
                      use_cpu=True, bf16=False, report_to="none", save_strategy="no", disable_tqdm=True)
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[rm, sync_f, async_f, pair_f],
                          reward_processing_classes=[rm_tok, None, None, None], args=args,
                          train_dataset=Dataset.from_dict({"prompt": PROMPTS}))
    try:
        trainer.train()
    finally:
        sync_f.close()
        pair_f.close()
    rewards = trainer._logs["rewards"]
    trl_own = [float(x) for x in rewards[trainer.reward_func_names[0]]]
    assert len(trl_own) == 4
    for name in ("rm_sync", "rm_async"):  # ONNX Runtime beside PyTorch eager: float32 rounding apart
        got = [float(x) for x in rewards[name]]
        assert max(abs(a - b) for a, b in zip(got, trl_own)) <= 1e-3, (name, got, trl_own)
    prompts, completions = list(trainer._logs["prompt"]), list(trainer._logs["completion"])
    pair = ort_scores([local_tokenizer().encode(p, c).ids for p, c in zip(prompts, completions)])
    assert_scores([float(x) for x in rewards["rm_pair"]], pair)
    assert max(abs(a - b) for a, b in zip(pair, trl_own)) > 1e-2  # the two encodings are not the same numbers


def test_reward_objects_pickle_and_score_after(replica):
    f = pickle.loads(pickle.dumps(rmscore_reward(replica.target)))
    try:
        assert_scores(f(prompts=PROMPTS[:2], completions=["Air.", "7"]), reference(PROMPTS[:2], ["Air.", "7"]))
        pickle.dumps(f)  # a used one too: its client stays behind
    finally:
        f.close()
    with RewardClient(replica.target) as client:
        with pytest.raises(TypeError, match="client object"):
            pickle.dumps(rmscore_reward(client))


def test_message_without_content_is_empty_text(replica):
    completion = [{"role": "assistant", "content": None, "tool_calls": [{"name": "f"}]}]
    assert message_text(completion) == ""
    f = rmscore_reward(replica.target)
    try:
        assert_scores(f(prompts=[PROMPTS[0]], completions=[completion]), reference([PROMPTS[0]], [""]))
    finally:
        f.close()


def test_on_error_none_returns_none_for_each_completion():
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    f = rmscore_reward(dead, on_error="none", timeout_s=1.0)
    try:
        assert f(prompts=PROMPTS[:2], completions=["a", "b"]) == [None, None]
    finally:
        f.close()
    with pytest.raises(ValueError, match="on_error"):
        rmscore_reward(dead, on_error="skip")


def test_health_does_not_raise_without_grpc_health(replica):
    code = ("import sys; sys.modules['grpc_health'] = None\n"
            "from rmscore_client import RewardClient\n"
            f"with RewardClient({replica.target!r}) as c:\n"
            "    h = c.health()\n"
            "print(h.serving, h.status)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("False ") and "grpcio-health-checking" in out.stdout
