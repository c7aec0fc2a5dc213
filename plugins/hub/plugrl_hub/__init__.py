"""plugrl-hub: ``trainer.push_to_hub``, the final checkpoint's model uploaded to the Hugging Face Hub.

:mod:`plugrl_hub.upload` talks to the Hub (huggingface_hub's ``HfApi``: ``create_repo``, ``upload_folder``);
:mod:`plugrl_hub.hooks` is the extension the kernel finds (entry point ``hub`` in group ``plugrl.extensions``), whose
hooks check the token at start, create the repo when the run starts and upload the last step's checkpoint.
"""

from .upload import HubError, hub_token, prepare_repo, push_checkpoint, repo_id_of, token_problem

__all__ = ["HubError", "hub_token", "prepare_repo", "push_checkpoint", "repo_id_of", "token_problem"]
