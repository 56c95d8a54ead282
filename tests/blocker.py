"""Source of a meta-path finder that makes importing the named top-level packages fail, for the
tests that run poise in a subprocess with torch (or ray, asyncio) unavailable."""


def blocker_source(*blocked: str) -> str:
    return f'''
import importlib.abc, sys
BLOCKED = {blocked!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked import of {{name}}")
        return None
sys.meta_path.insert(0, Block())
'''
