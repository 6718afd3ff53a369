@echo off
rem aitk desktop launcher for Windows: update the checkout, then start the toolkit.
rem The work is done by aitk-launch.ps1 beside this file; output also goes to
rem logs\launcher.log in the checkout. On failure the window stays open with the error.
setlocal
cd /d "%~dp0..\.."
powershell.exe -NoProfile -ExecutionPolicy Bypass -File "%~dp0aitk-launch.ps1"
set "AITK_CODE=%ERRORLEVEL%"
if not "%AITK_CODE%"=="0" (
    echo.
    echo aitk stopped with exit code %AITK_CODE%. The log is in "%CD%\logs\launcher.log".
    pause
)
exit /b %AITK_CODE%
