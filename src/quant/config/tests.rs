use serde_json::json;

use super::*;

fn w8a8() -> Value {
    json!({"quantization_config": {"quant_method": "compressed-tensors", "format": "int-quantized",
        "quantization_status": "compressed", "ignore": ["lm_head", "re:.*layers\\.1\\.mlp\\.down_proj$"],
        "kv_cache_scheme": null, "sparsity_config": {},
        "config_groups": {"group_0": {"targets": ["Linear"], "output_activations": null,
            "weights": {"num_bits": 8, "type": "int", "symmetric": true, "strategy": "channel",
                        "group_size": null, "dynamic": false, "actorder": null},
            "input_activations": {"num_bits": 8, "type": "int", "symmetric": true,
                                  "strategy": "token", "dynamic": true}}}}})
}

#[test]
fn w8a8_with_ignore_patterns() {
    let c = CtConfig::from_config(&w8a8()).unwrap().unwrap();
    let s = c.scheme_for("model.layers.0.mlp.down_proj").unwrap();
    assert_eq!(s, Scheme { weight: WeightFormat::Int8, act: ActQuant::Int8Token });
    assert_eq!(c.label(), "w8a8-int8");
    assert!(c.scheme_for("lm_head").is_none());
    assert!(c.scheme_for("model.layers.1.mlp.down_proj").is_none(), "re: pattern");
    assert!(c.scheme_for("model.layers.11.mlp.down_proj").is_some(), "pattern ends with $");
    assert!(CtConfig::from_config(&json!({"model_type": "llama"})).unwrap().is_none());
}

#[test]
fn old_key_fp8_and_w4a16() {
    let mut v = w8a8();
    let mut q = v["quantization_config"].take();
    q["format"] = json!("float-quantized");
    q["config_groups"]["group_0"]["weights"]["type"] = json!("float");
    q["config_groups"]["group_0"]["weights"]["strategy"] = json!("tensor");
    q["config_groups"]["group_0"]["input_activations"]["type"] = json!("float");
    let c = CtConfig::from_config(&json!({"compression_config": q})).unwrap().unwrap();
    assert_eq!(c.label(), "fp8");
    let w4 = json!({"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["re:.*proj$"], "input_activations": null,
            "weights": {"num_bits": 4, "type": "int", "symmetric": false, "strategy": "group",
                        "group_size": 128, "actorder": "group"}}}}});
    let c = CtConfig::from_config(&w4).unwrap().unwrap();
    let want = WeightFormat::Int4 { group: Some(128), symmetric: false, g_idx: true };
    assert_eq!(c.scheme_for("model.layers.0.self_attn.q_proj").unwrap().weight, want);
    assert!(c.scheme_for("lm_head").is_none(), "not targeted");
    assert_eq!(c.label(), "w4a16");
}

/// Each unsupported setting is a one-line InvalidInput error naming its field.
#[test]
fn unknown_schemes_name_the_field() {
    let cases: [(&str, Value, &str); 9] = [
        ("/quantization_config/quant_method", json!("gptq"), "quant_method"),
        ("/quantization_config/format", json!("nvfp4-pack-quantized"), "format"),
        (
            "/quantization_config/config_groups/group_0/weights/num_bits",
            json!(4),
            "weights.num_bits",
        ),
        (
            "/quantization_config/config_groups/group_0/weights/strategy",
            json!("block"),
            "weights.strategy",
        ),
        (
            "/quantization_config/config_groups/group_0/input_activations/dynamic",
            json!(false),
            "input_activations.dynamic",
        ),
        (
            "/quantization_config/config_groups/group_0/input_activations/strategy",
            json!("tensor"),
            "input_activations.strategy",
        ),
        ("/quantization_config/kv_cache_scheme", json!({"num_bits": 8}), "kv_cache_scheme"),
        ("/quantization_config/quantization_status", json!("frozen"), "quantization_status"),
        ("/quantization_config/ignore", json!(["re:("]), "ignore"),
    ];
    for (path, value, field) in cases {
        let mut v = w8a8();
        *v.pointer_mut(path).unwrap() = value;
        let err = CtConfig::from_config(&v).unwrap_err();
        let msg = err.to_string();
        assert_eq!(crate::error::kind_of(&err), ErrorKind::InvalidInput, "{msg}");
        assert!(msg.contains(field) && !msg.contains('\n'), "{path}: {msg}");
    }
}
