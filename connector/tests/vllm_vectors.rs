//! Every case of vLLM's block-hash vectors (`tests/data/vllm_block_hash_vectors.json`), byte for byte:
//! root hashes, the CBOR of block 0, every block hash and its KV-event form.

use connector::keys::{ExtraKeyLayout, Lora, MmItem, RequestExtras, VllmHasher, root_hash};
use serde_json::Value;

fn vectors() -> Value {
    let text = include_str!("data/vllm_block_hash_vectors.json");
    serde_json::from_str(text).expect("the vectors file is JSON")
}

fn extras(case: &Value) -> RequestExtras {
    let mut e = RequestExtras::default();
    if case["extra_keys_layout"] == "untagged" {
        e.layout = ExtraKeyLayout::Untagged;
    }
    let r = &case["request_extras"];
    if let Some(name) = r["lora_name"].as_str() {
        e.lora = Some(Lora {
            name: name.into(),
            path: r["lora_path"].as_str().unwrap_or_default().into(),
        });
    }
    e.cache_salt = r["cache_salt"].as_str().map(str::to_owned);
    if let Some(items) = r["mm_features"].as_array() {
        e.mm = items
            .iter()
            .map(|i| MmItem {
                identifier: i["identifier"].as_str().unwrap().into(),
                offset: i["offset"].as_u64().unwrap() as usize,
                length: i["length"].as_u64().unwrap() as usize,
            })
            .collect();
    }
    e.lookahead_tokens = r["num_hash_lookahead_tokens"].as_u64().unwrap_or(0) as usize;
    e
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn root_hashes_match() {
    let v = vectors();
    for (seed, want) in v["root_parent_hashes"].as_object().unwrap() {
        let seed = (seed != "vllm-none-hash").then_some(seed.as_str());
        assert_eq!(root_hash(seed).to_hex(), want.as_str().unwrap(), "{seed:?}");
    }
}

#[test]
fn all_seventeen_cases_match_byte_for_byte() {
    let v = vectors();
    let cases = v["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 17);
    let mut layouts = [0, 0];
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let seed = case["hash_seed"].as_str();
        let root = root_hash(seed);
        assert_eq!(
            root.to_hex(),
            case["root_parent_hash"].as_str().unwrap(),
            "{name}"
        );
        let tokens: Vec<u32> = case["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let hasher = VllmHasher::new(root, case["block_size"].as_u64().unwrap() as usize);
        let extras = extras(case);
        if case["extra_keys_layout"].is_string() {
            layouts[usize::from(extras.layout == ExtraKeyLayout::Untagged)] += 1;
        }
        let hashes = hasher.block_hashes(&tokens, &extras);
        let want: Vec<&str> = case["expected_block_hashes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_str().unwrap())
            .collect();
        let got: Vec<String> = hashes.iter().map(|h| h.to_hex()).collect();
        assert_eq!(got, want, "{name}");
        let events: Vec<u64> = case["expected_kv_event_u64"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_u64().unwrap())
            .collect();
        assert_eq!(
            hashes.iter().map(|h| h.kv_event_u64()).collect::<Vec<_>>(),
            events,
            "{name}"
        );
        if let Some(cbor) = case["first_block_cbor_hex"].as_str() {
            assert_eq!(
                hex(&hasher.block_bytes(&root, &tokens, &extras, 0)),
                cbor,
                "{name}"
            );
        }
    }
    assert!(
        layouts[0] >= 4 && layouts[1] == 4,
        "both extra-key layouts covered: {layouts:?}"
    );
}
