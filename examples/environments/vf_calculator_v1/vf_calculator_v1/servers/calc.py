"""The calculator: an MCP tool server verifiers starts once for the taskset's rollouts and installs into the
harness (its tool is named calc_multiply)."""

import verifiers.v1 as vf


class CalcToolset(vf.Toolset[vf.SharedToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers and return the product."""
        return a * b


if __name__ == "__main__":
    CalcToolset.run()
