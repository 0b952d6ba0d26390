from prefixgate.doctor import distribution as dist


def test_block_from_gcd_snaps_to_power_of_two():
    b = dist.infer_block([17920, 256, 64 * 7, 64 * 301, 64 * 1001])
    assert b is not None and b.block == 64 and b.confident
    # gcd 192 = 3 × 64 → the block is 64
    assert dist.infer_block([192, 384, 576, 960]).block == 64


def test_block_of_token_granular_cache_is_the_gcd():
    b = dist.infer_block([17921, 300, 5, 77])
    assert b.block == 1


def test_one_value_is_not_confident():
    b = dist.infer_block([17920])
    assert b.block == 512 and not b.confident


def group(cached, prompts):
    return dist.ValueGroup(
        cached,
        len(prompts),
        sum(prompts),
        min(prompts),
        max(prompts),
        float(sum(p * p for p in prompts)),
    )


def test_pinned_constant_explains_the_seed_rate():
    pinned = [40000 + i * 370 for i in range(383)]  # 40k … 181k
    groups = [group(0, [41000] * 28), group(256, [41000] * 40), group(17920, pinned)]
    d = dist.analyse(groups, 64)
    assert d.pinned is not None
    p = d.pinned
    assert (p.value, p.k, p.block, p.requests) == (17920, 280, 64, 383)
    assert p.explains
    assert abs(p.explained_rate - 383 * 17920 / d.prompt_tokens) < 1e-12
    labels = [b.label for b in d.buckets]
    assert labels[0] == "0" and "16k–64k" in labels


def test_no_pinned_value_when_prompts_do_not_vary():
    # one fixed request replayed: a constant cached value is expected, not pinned
    d = dist.analyse([group(17920, [20000] * 50)], 64)
    assert d.pinned is None


def test_no_pinned_value_in_a_healthy_slice():
    groups = [group(64 * k, [64 * k + 900]) for k in range(100, 400, 3)]
    assert dist.analyse(groups, 64).pinned is None
