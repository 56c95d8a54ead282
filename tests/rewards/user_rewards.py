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

# ... and one that raises for some samples (each such call is a counted failure)
FLAKY = '''
def flaky(prompts, completions, answer, **kwargs):
    if len(completions[0]) % 3 == 0:
        raise ValueError("no reward for this one")
    return sorted_items(prompts, completions, answer)
'''
