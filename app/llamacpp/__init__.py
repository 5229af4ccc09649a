"""llama.cpp's own server routes that editor plugins speak (llama.vscode, llama.vim): /infill."""
