"""Which activation vLLM's pooling routes apply to a one-label classifier, from its config.json
(vLLM's get_act_fn: problem_type first, then a sentence-transformers activation_fn; else sigmoid)."""

from rmscore.frontends.vllm_api import _identity_activation


def test_activation_follows_the_model_config():
    assert not _identity_activation({})  # a one-label classifier: sigmoid
    assert _identity_activation({"problem_type": "regression"})
    assert not _identity_activation({"problem_type": "single_label_classification"})
    assert _identity_activation({"sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}})
    assert not _identity_activation({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"}})

