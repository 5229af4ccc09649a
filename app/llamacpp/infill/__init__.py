"""POST /infill: llama.cpp's fill-in-the-middle route for editor completion plugins."""
