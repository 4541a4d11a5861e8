"""An OpenAI-compatible server in front of a served TokenRouter (``tokenrouter serve`` starts it
beside Triton; docs/compatibility.md, "OpenAI API"). Not imported by the Triton models.

    python -m tokenrouter.openai_server --model-repository DIR --triton-url 127.0.0.1:8001 --port 9000
"""
