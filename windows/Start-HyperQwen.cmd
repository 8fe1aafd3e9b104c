@echo off
rem HyperQwen for Docker Desktop on WSL2: double-click to start the single-user server and open the monitor.
rem Options pass through to Start-HyperQwen.ps1, e.g.:  Start-HyperQwen.cmd -Mode batch -WebUI
rem Ctrl+C or closing this window stops the stack.
setlocal
powershell.exe -NoLogo -NoProfile -ExecutionPolicy Bypass -File "%~dp0Start-HyperQwen.ps1" %*
set "HQ_EXIT=%ERRORLEVEL%"
if not "%HQ_EXIT%"=="0" pause
exit /b %HQ_EXIT%
