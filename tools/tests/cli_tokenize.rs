//! `leanstream tokenize` (issue 24, item 8): the ids a text becomes, as `generate` encodes it,
//! one `id<TAB>'piece'` line each or `--ids` as a list; `--decode` back to text; control-token
//! text is plain text unless `--special`.

mod common;

use leanstream::load::open_model;
use std::process::Command;

fn leanstream(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_leanstream"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(args: &[&str]) -> String {
    let (code, out, err) = leanstream(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    out
}

#[test]
fn smollm2_ids_pieces_special_and_decode() {
    let Some(model) = common::model(common::SMOLLM2) else {
        return;
    };
    let m = model.to_str().unwrap();
    let (_, tok) = open_model(&model, None).unwrap();
    let text = "Hello world<|im_end|>\n";
    let want = tok.encode(text, tok.add_bos_default());
    let list = ok(&["tokenize", "--model", m, "--text", text, "--ids"]);
    let shown: Vec<String> = want.iter().map(u32::to_string).collect();
    assert_eq!(list, format!("[{}]\n", shown.join(", ")));
    // Plain text: `<|im_end|>` is its characters.
    let im_end = tok.token_id("<|im_end|>").unwrap();
    assert!(!want.contains(&im_end));
    let lines = ok(&["tokenize", "--model", m, "--text", text]);
    let rows: Vec<&str> = lines.lines().collect();
    assert_eq!(rows.len(), want.len(), "{lines}");
    assert_eq!(rows[0], format!("{}\t'Hello'", want[0]));
    assert_eq!(rows[1], format!("{}\t' world'", want[1]));
    assert_eq!(
        *rows.last().unwrap(),
        format!("{}\t'\\n'", want.last().unwrap())
    );
    // --special: the control token.
    let special = ok(&["tokenize", "--model", m, "--text", text, "--special"]);
    assert!(
        special.contains(&format!("{im_end}\t'<|im_end|>'")),
        "{special}"
    );
    // --file gives what --text gives.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("prompt.txt");
    std::fs::write(&f, text).unwrap();
    assert_eq!(
        ok(&[
            "tokenize",
            "--model",
            m,
            "--file",
            f.to_str().unwrap(),
            "--ids"
        ]),
        list
    );
    // --decode: back to the text.
    let ids = shown.join(",");
    assert_eq!(
        ok(&["tokenize", "--model", m, "--decode", &ids]),
        format!("{text}\n")
    );
}

#[test]
fn stories260k_takes_its_tokenizer_and_adds_bos() {
    let Some((model, tok)) = common::stories260k() else {
        return;
    };
    let (m, t) = (model.to_str().unwrap(), tok.to_str().unwrap());
    let base = [
        "tokenize",
        "--model",
        m,
        "--tokenizer",
        t,
        "--text",
        "Once upon",
    ];
    let (_, tk) = open_model(&model, Some(&tok)).unwrap();
    let want = tk.encode("Once upon", true);
    assert_eq!(want[0], 1);
    let shown: Vec<String> = want.iter().map(u32::to_string).collect();
    assert_eq!(
        ok(&[&base[..], &["--ids"]].concat()),
        format!("[{}]\n", shown.join(", "))
    );
    let lines = ok(&base);
    assert!(lines.starts_with("1\t'<s>'\n"), "{lines}");
    assert_eq!(
        ok(&[&base[..], &["--ids", "--no-bos"]].concat()),
        format!("[{}]\n", shown[1..].join(", "))
    );
    assert_eq!(
        ok(&[
            "tokenize",
            "--model",
            m,
            "--tokenizer",
            t,
            "--decode",
            &shown.join(",")
        ]),
        "Once upon\n"
    );
}

#[test]
fn bad_tokenize_requests_are_clear_errors() {
    let Some((model, tok)) = common::stories260k() else {
        return;
    };
    let (m, t) = (model.to_str().unwrap(), tok.to_str().unwrap());
    for (extra, needle) in [
        (&[][..], "give the text with --text"),
        (&["--decode", "1,x"][..], "'x' is not a token id"),
        (
            &["--decode", "512"][..],
            "id 512 is outside the vocabulary of 512 tokens",
        ),
        (&["--file", "/nonexistent/p.txt"][..], "/nonexistent/p.txt"),
    ] {
        let mut a = vec!["tokenize", "--model", m, "--tokenizer", t];
        a.extend_from_slice(extra);
        let (code, _, err) = leanstream(&a);
        assert_eq!(code, 1, "{a:?}: {err}");
        assert!(err.contains(needle), "{a:?}: {err}");
    }
}
