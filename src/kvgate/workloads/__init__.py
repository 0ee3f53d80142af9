"""Beside the runners, the workloads: what the embedded CPU default asks of the engine, made by kvgate itself.

Owns
    tiny_models     the small models of the CPU default (`kvgate:<name>` in matrix/workloads.toml), built or
                    unpacked locally, nothing downloaded
    gsm8k_problems  kvgate's own grade-school problems in gsm8k's format (generator and shipped splits)
    gsm8k_local     lm-eval's gsm8k task pointed at those problems (a task YAML that includes lm-eval's own)
    gsm8k_pool      the hub models' questions: lm-eval's gsm8k task over gsm8k's test split followed by its train
                    split, written from the Hugging Face cache in the run
    passkey         the long-context task: passkey retrieval at declared lengths and depths, documents written and
                    scored by kvgate (an lm-eval task the accuracy stage's engine asks after gsm8k)
    training_problems  the tiny models' training problems, disjoint from the test problems (checked), and
                    training_wordings, their sentence variants
    data/           the shipped problem files and tokenizer corpus

It may import the matrix; it must never import the runners, the gate, the report or the CLI. torch,
tokenizers and safetensors are imported only inside the functions that build a model.
"""
