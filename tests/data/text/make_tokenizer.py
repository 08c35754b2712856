"""make_tokenizer.py — writes tokenizer.json and tokenizer_config.json here: the byte-level BPE tokenizer the
text-training tests use (tests/cli/test_train_text.sh), trained with Hugging Face `tokenizers` on a small seeded
English corpus of lowercase ASCII, 120 ids (so every id fits the tiny goldens' vocabulary of 128):

  3 special tokens (<|endoftext|> 0, <|im_start|> 1, <|im_end|> 2), the alphabet of the corpus (each character as
  byte-level BPE writes it: 'Ġ' for the space, 'Ċ' for the newline) and merges up to 120 ids.

tokenizer_config.json names <|im_end|> the EOS token and carries a ChatML chat template whose assistant turns are
{% generation %} blocks (content and <|im_end|>; the newline after it outside), so that transformers'
apply_chat_template(return_assistant_tokens_mask=True) gives the reference mask. Regenerate only on purpose:
python3 make_tokenizer.py (tokenizers 0.23)."""
import json
import os
import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
WORDS = ("the cat sat on a mat and dog ran to big red sun hello world what is two plus yes no you are test "
         "assistant user system one three four five").split()
random.seed(1)
corpus = [" ".join(random.choice(WORDS) for _ in range(12)) + "." for _ in range(400)]
corpus.append("abcdefghijklmnopqrstuvwxyz 0123456789 .,?!'-:\n")

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                              show_progress=False)
tok.train_from_iterator(corpus, trainer)
tok.save(os.path.join(HERE, "tokenizer.json"))

TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\\nyou are a test assistant.<|im_end|>\\n' }}{% endif %}"
            "{{ '<|im_start|>' + message['role'] + '\\n' }}{% if message['role'] == 'assistant' %}{% generation %}"
            "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}{% else %}"
            "{{ message['content'] + '<|im_end|>' + '\\n' }}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
with open(os.path.join(HERE, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
               "chat_template": TEMPLATE}, f, indent=1)
    f.write("\n")
print("vocabulary", tok.get_vocab_size())
