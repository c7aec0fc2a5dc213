"""The keys of ``trainer.push_to_hub``, which this package adds to the run config's ``trainer`` section (entry-point
group ``plugrl.config_fields``): whether to upload the final checkpoint's model, and to which repo."""

from __future__ import annotations

from pydantic import Field, model_validator

from plugrl.config import ConfigFields, Section


class HubKeys(Section):
    push_to_hub: bool = Field(
        False,
        description="Upload the final checkpoint's policy/ folder (HF format) to the Hugging Face Hub; token from "
        "HF_TOKEN (or `hf auth login`), endpoint from HF_ENDPOINT. The repo is created at start, so a missing "
        "token or repo access fails before training. Needs a final checkpoint (trainer.save_freq not 0).",
    )
    hub_model_id: str | None = Field(
        None,
        description="The repo push_to_hub uploads to: owner/name, or name in the token's namespace; default: "
        "trainer.experiment_name.",
    )
    hub_private_repo: bool | None = Field(
        None, description="Create the push_to_hub repo private (true) or public (false); null: the hub's default."
    )

    @model_validator(mode="after")
    def _hub_needs_a_checkpoint(self) -> HubKeys:
        if self.push_to_hub and not self.saves:
            raise ValueError(
                f"trainer.push_to_hub uploads the final checkpoint, but trainer.save_freq={self.save_freq} writes "
                "none; set trainer.save_freq to end (at the end only) or N, or trainer.push_to_hub=false"
            )
        return self


FIELDS = ConfigFields(sections={"trainer": HubKeys})
