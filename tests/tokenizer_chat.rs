//! Chat template detection and rendering, against exact expected prompts.

use leanstream::tokenizer::{ChatFormat, ChatMessage, TokenizerError};

fn m<'a>(role: &'a str, content: &'a str) -> ChatMessage<'a> {
    ChatMessage { role, content }
}

const PLAIN_CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + \
    message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Qwen2.5-style: a default system prompt in an escaped string literal, after a non-literal one.
const QWEN_LIKE: &str = "{%- if messages[0]['role'] == 'system' %}\n    {{- '<|im_start|>system\\n' + messages[0]['content'] + \
    '<|im_end|>\\n' }}\n{%- else %}\n    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful \
    assistant.<|im_end|>\\n' }}\n{%- endif %}\n{%- for message in messages %}...{%- endfor %}";

#[test]
fn plain_chatml_renders_exactly() {
    let f = ChatFormat::detect(Some(PLAIN_CHATML)).unwrap();
    assert_eq!(
        f,
        ChatFormat::ChatMl {
            default_system: None
        }
    );
    let msgs = [
        m("system", "Be brief."),
        m("user", "Hi"),
        m("assistant", "Hello!"),
        m("user", "2+2?"),
    ];
    assert_eq!(
        f.render(&msgs, true),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        f.render(&msgs[1..2], false),
        "<|im_start|>user\nHi<|im_end|>\n"
    );
    // No template at all: llama.cpp's fallback, ChatML.
    assert_eq!(ChatFormat::detect(None).unwrap(), f);
}

#[test]
fn chatml_default_system_prompt_is_injected_only_without_a_system_message() {
    let f = ChatFormat::detect(Some(QWEN_LIKE)).unwrap();
    let sys = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
    assert_eq!(
        f,
        ChatFormat::ChatMl {
            default_system: Some(sys.to_string())
        }
    );
    assert_eq!(
        f.render(&[m("user", "hi")], true),
        format!("<|im_start|>system\n{sys}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    );
    assert_eq!(
        f.render(&[m("system", "Own."), m("user", "hi")], false),
        "<|im_start|>system\nOwn.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    );
    // Qwen's tool results: consecutive ones share one user turn.
    assert_eq!(
        f.render(&[m("system", "S"), m("tool", "a"), m("tool", "b")], false),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n\
         <tool_response>\nb\n</tool_response><|im_end|>\n"
    );
}

#[test]
fn llama2_and_llama3_render() {
    let l2 = ChatFormat::detect(Some(
        "{{ bos_token }}[INST] <<SYS>>\\n{{ system }}\\n<</SYS>>\\n\\n ... [/INST]",
    ))
    .unwrap();
    assert_eq!(l2, ChatFormat::Llama2);
    assert_eq!(
        l2.render(
            &[
                m("system", "S"),
                m("user", "U1"),
                m("assistant", "A1"),
                m("user", "U2")
            ],
            true
        ),
        "[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST]A1</s><s>[INST] U2 [/INST]"
    );
    let l3 = ChatFormat::detect(Some(
        "<|start_header_id|>{{ role }}<|end_header_id|>\\n\\n{{ content }}<|eot_id|>",
    ))
    .unwrap();
    assert_eq!(l3, ChatFormat::Llama3);
    assert_eq!(
        l3.render(&[m("user", "Hi")], true),
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

#[test]
fn unsupported_template_is_a_clear_error() {
    let err = ChatFormat::detect(Some(
        "{% for m in messages %}<|user|>{{ m.content }}</s>{% endfor %}",
    ))
    .unwrap_err();
    assert!(matches!(err, TokenizerError::UnsupportedChatTemplate(_)));
    assert!(
        err.to_string().starts_with("chat template not supported: "),
        "{err}"
    );
}
