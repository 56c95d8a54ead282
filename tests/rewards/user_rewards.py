"""Reward functions as a user writes them (in a file of their own), shared by the reward tests."""

# The built-in `items` reward, as a user would write it: equal in effect to the default `task`
# reward on the warm start's sort prompts, so its rewards differ within groups from step 0 on.
ITEMS = '''
def sorted_items(prompts, completions, answer, **kwargs):
    out = []
    for ref, got in zip(answer, completions):
        ref, got = ref.split(), got.split()
        hits = sum(1 for r, g in zip(ref, got) if r == g)
        out.append(1.0 if not ref and not got else hits / max(len(ref), len(got)))
    return out
'''

# One the policy learns within a few steps, whatever the machine's rounding: shorter completions
# score higher (the items reward rises by ~0.03 in 30 steps, within a seed's noise).
BRIEF = '''
def brief(prompts, completions, answer, **kwargs):
    return [max(0.0, 1.0 - len(c) / 24) for c in completions]
'''

# ... and one that raises for some samples (each such call is a counted failure)
FLAKY = '''
def flaky(prompts, completions, answer, **kwargs):
    if len(completions[0]) % 3 == 0:
        raise ValueError("no reward for this one")
    return sorted_items(prompts, completions, answer)
'''
